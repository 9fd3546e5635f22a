#!/usr/bin/env python3
"""A loopback OAuth2 server with single-use rotating refresh tokens (RFC 9700 §4.14.2).

Every refresh spends its refresh token and issues a new pair. Presenting a spent refresh token
is treated as theft: the whole token family is revoked (every later refresh and every access
token of the family fail), as the recommendation says. This is what makes uncoordinated
processes log each other out, and what the fleet coordination tests run against.

  POST /token      grant_type=refresh_token&refresh_token=R  -> 200 {access_token, refresh_token,
                   expires_in, token_type} or 400 {"error": "invalid_grant"}
  GET|POST /api/*  Authorization: Bearer A -> 200 {"code": 0} or 401
  GET /stats       {"refreshes": N, "reuses": N, "revoked": bool, "api": N, "unauthorized": N}
  POST /expire     every access token issued so far expires (one expiry of a multi-expiry run)

Usage: oauth2-rotating-server.py [--port N] [--credentials FILE] [--refresh-delay-ms N]
It prints `listening PORT` once ready, and writes FILE (the client's credentials: an access
token the server already considers expired, and the family's first refresh token).
"""
import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs


class Family:
    def __init__(self):
        self.lock = threading.Lock()
        self.refresh = "refresh-0"
        self.spent = set()
        self.access = set()  # "expired-0" is not in it: the first request gets a 401
        self.revoked = False
        self.refreshes = 0
        self.reuses = 0
        self.api = 0
        self.unauthorized = 0


family = Family()
delay = 0.0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length).decode() if length else ""

    def do_GET(self):
        if self.path == "/stats":
            with family.lock:
                return self.reply(200, {
                    "refreshes": family.refreshes, "reuses": family.reuses, "revoked": family.revoked,
                    "api": family.api, "unauthorized": family.unauthorized})
        self.api()

    def do_POST(self):
        if self.path == "/expire":
            # Every access token issued so far stops being accepted: the next expiry of a run.
            self.body()
            with family.lock:
                family.access.clear()
            return self.reply(200, {"expired": True})
        if self.path != "/token":
            self.body()
            return self.api()
        form = parse_qs(self.body())
        token = (form.get("refresh_token") or [""])[0]
        if (form.get("grant_type") or [""])[0] != "refresh_token":
            return self.reply(400, {"error": "unsupported_grant_type"})
        if delay:
            time.sleep(delay)
        with family.lock:
            if token in family.spent or family.revoked:
                family.reuses += 1 if token in family.spent else 0
                family.revoked = True
                family.access.clear()
                return self.reply(400, {"error": "invalid_grant", "error_description": "refresh token reused"})
            if token != family.refresh:
                return self.reply(400, {"error": "invalid_grant"})
            family.refreshes += 1
            family.spent.add(token)
            family.refresh = "refresh-%d" % family.refreshes
            access = "access-%d" % family.refreshes
            family.access.add(access)
            pair = {"access_token": access, "refresh_token": family.refresh, "expires_in": 3600,
                    "token_type": "Bearer"}
        self.reply(200, pair)

    def api(self):
        header = self.headers.get("Authorization") or ""
        token = header[7:] if header.startswith("Bearer ") else ""
        with family.lock:
            family.api += 1
            ok = token in family.access and not family.revoked
            if not ok:
                family.unauthorized += 1
        if ok:
            self.reply(200, {"code": 0})
        else:
            self.reply(401, {"error": "invalid_token"})


def main():
    global delay
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--credentials")
    parser.add_argument("--refresh-delay-ms", type=int, default=50)
    arguments = parser.parse_args()
    delay = arguments.refresh_delay_ms / 1000
    if arguments.credentials:
        with open(arguments.credentials, "w") as file:
            json.dump({"access_token": "expired-0", "refresh_token": "refresh-0",
                       "expires_at": "2020-01-01T00:00:00Z"}, file)
    server = ThreadingHTTPServer(("127.0.0.1", arguments.port), Handler)
    server.daemon_threads = True
    print("listening %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
