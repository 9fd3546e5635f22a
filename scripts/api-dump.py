#!/usr/bin/env python3
"""Keeps the public API of a `swift-api-digester -dump-sdk` dump: drops every `package` declaration
(the digester marks them "isInternal") with what it contains, and writes the rest compactly with sorted
keys, so that a dump is the same bytes for the same API. Usage: api-dump.py IN.json OUT.json"""
import json
import sys


def public(node):
    children = node.get("children")
    if children is not None:
        node["children"] = [public(c) for c in children if not c.get("isInternal")]
    return node


with open(sys.argv[1]) as f:
    dump = json.load(f)
with open(sys.argv[2], "w") as f:
    dump["ABIRoot"] = public(dump["ABIRoot"])
    json.dump(dump, f, separators=(",", ":"), sort_keys=True)
    f.write("\n")
