#!/usr/bin/env python3
"""A loopback OAuth2 server with single-use rotating refresh tokens (RFC 9700 §4.14.2).

Every refresh spends its refresh token and issues a new pair. Presenting a spent refresh token
is treated as theft: the whole token family is revoked (every later refresh and every access
token of the family fail), as the recommendation says. This is what makes uncoordinated
processes log each other out, and what the fleet coordination tests run against.

  POST /token      grant_type=refresh_token&refresh_token=R  -> 200 {access_token, refresh_token,
                   expires_in, token_type} or 400 {"error": "invalid_grant"}
                   (a `?p=NAME` on the URL names the caller in the log)
  GET|POST /api/*  Authorization: Bearer A -> 200 {"code": 0} or 401; /api/revoked* answers 403 (a
                   logout rule's code) to a valid token
  GET /stats       {"refreshes": N, "reuses": N, "revoked": bool, "api": N, "unauthorized": N,
                    "family": N, "in_flight": [caller, ...]}
  POST /expire     every access token issued so far expires (one expiry of a multi-expiry run)
  POST /fault      the next `count` token calls answer `status` (503, 429 with Retry-After:
                   `retry_after`) without spending anything, or are answered `delay_ms` late
                   (the token is spent when the call arrives, as a real server does)
  POST /reset      a new token family (after a revocation): writes --credentials again

Usage: oauth2-rotating-server.py [--port N] [--credentials FILE] [--refresh-delay-ms N]
       [--expires-in SECONDS] [--api-delay-ms N] [--log FILE]
It prints `listening PORT` once ready, and writes FILE (the client's credentials: an access
token the server already considers expired, and the family's first refresh token). With --log,
every token call is a JSON line: when it arrived and was answered, the caller, the refresh token
presented, and what it came to (ok with the pair issued, reuse, refused, fault, revoked); and
every access token refused on its first use (it expired, by /expire, before the client that got
it could send it) is an `access-refused-fresh` line: the server refusing a token it had just
issued, which a policy's `on-exhausted` may answer with a logout.
"""
import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class Family:
    def __init__(self, number=0):
        self.lock = threading.Lock()
        self.number = number
        self.prefix = "" if number == 0 else "f%d-" % number
        self.refresh = self.prefix + "refresh-0"
        self.spent = set()
        self.access = set()  # "expired-0" is not in it: the first request gets a 401
        self.issued = set()  # every access token issued in this family
        self.sent = set()  # those a client has sent (accepted, or refused once on first use)
        self.revoked = False
        self.refreshes = 0
        self.reuses = 0
        self.api = 0
        self.unauthorized = 0
        self.faults = []  # pending: dicts with status / retry_after / delay_ms
        self.in_flight = {}


family = Family()
delay = 0.0
api_delay = 0.0
expires_in = 3600
log_file = None
log_lock = threading.Lock()
credentials_path = None


def log(entry):
    if not log_file:
        return
    with log_lock:
        log_file.write(json.dumps(entry, sort_keys=True) + "\n")
        log_file.flush()


def write_credentials():
    if credentials_path:
        with open(credentials_path, "w") as file:
            json.dump({"access_token": family.prefix + "expired-0", "refresh_token": family.refresh,
                       "expires_at": "2020-01-01T00:00:00Z"}, file)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, headers=None):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
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
                    "api": family.api, "unauthorized": family.unauthorized, "family": family.number,
                    "in_flight": sorted(family.in_flight.values())})
        self.api()

    def do_POST(self):
        global family
        path = urlsplit(self.path).path
        if path == "/expire":
            # Every access token issued so far stops being accepted: the next expiry of a run.
            self.body()
            with family.lock:
                family.access.clear()
            return self.reply(200, {"expired": True})
        if path == "/fault":
            form = parse_qs(self.body())
            fault = {key: int(values[0]) for key, values in form.items() if key != "count"}
            with family.lock:
                family.faults.extend([fault] * int((form.get("count") or ["1"])[0]))
            return self.reply(200, {"queued": len(family.faults)})
        if path == "/reset":
            self.body()
            number = family.number + 1
            family = Family(number)
            write_credentials()
            log({"event": "reset", "family": number, "at": time.time()})
            return self.reply(200, {"family": number, "refresh_token": family.refresh})
        if path != "/token":
            self.body()
            return self.api()
        self.token()

    def token(self):
        caller = (parse_qs(urlsplit(self.path).query).get("p") or ["-"])[0]
        form = parse_qs(self.body())
        token = (form.get("refresh_token") or [""])[0]
        arrived = time.time()
        call = {"event": "token", "caller": caller, "presented": token, "arrived": arrived,
                "family": family.number}
        if (form.get("grant_type") or [""])[0] != "refresh_token":
            return self.reply(400, {"error": "unsupported_grant_type"})
        with family.lock:
            fault = family.faults.pop(0) if family.faults else None
        if fault and fault.get("status"):
            call.update(result="fault", status=fault["status"], answered=time.time())
            log(call)
            headers = {"Retry-After": str(fault["retry_after"])} if fault.get("retry_after") else None
            return self.reply(fault["status"], {"error": "temporarily_unavailable"}, headers)
        current = family
        # The call is received: the token is spent now, whatever happens to the caller after.
        with current.lock:
            ident = object()
            current.in_flight[id(ident)] = caller
            if token in current.spent or current.revoked:
                if token in current.spent:
                    current.reuses += 1
                    call["result"] = "reuse"
                else:
                    call["result"] = "revoked"
                current.revoked = True
                current.access.clear()
                status, body = 400, {"error": "invalid_grant", "error_description": "refresh token reused"}
            elif token != current.refresh:
                call["result"] = "refused"
                status, body = 400, {"error": "invalid_grant"}
            else:
                current.refreshes += 1
                current.spent.add(token)
                current.refresh = current.prefix + "refresh-%d" % current.refreshes
                access = current.prefix + "access-%d" % current.refreshes
                current.access.add(access)
                current.issued.add(access)
                call["result"] = "ok"
                call["issued"] = current.refresh
                status, body = 200, {"access_token": access, "refresh_token": current.refresh,
                                     "expires_in": expires_in, "token_type": "Bearer"}
        wait = delay + (fault.get("delay_ms", 0) / 1000 if fault else 0)
        if wait:
            time.sleep(wait)
        with current.lock:
            current.in_flight.pop(id(ident), None)
        call["answered"] = time.time()
        log(call)
        try:
            self.reply(status, body)
        except OSError:
            pass

    def api(self):
        header = self.headers.get("Authorization") or ""
        token = header[7:] if header.startswith("Bearer ") else ""
        if api_delay:
            time.sleep(api_delay)
        with family.lock:
            family.api += 1
            ok = token in family.access and not family.revoked
            if ok:
                family.sent.add(token)
            else:
                family.unauthorized += 1
                if token in family.issued and token not in family.sent and not family.revoked:
                    family.sent.add(token)
                    log({"event": "access-refused-fresh", "token": token, "at": time.time(),
                         "family": family.number})
        if ok and self.path.startswith("/api/revoked"):
            self.reply(403, {"error": "session_revoked"})
        elif ok:
            self.reply(200, {"code": 0})
        else:
            self.reply(401, {"error": "invalid_token"})


def main():
    global delay, api_delay, expires_in, log_file, credentials_path
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--credentials")
    parser.add_argument("--refresh-delay-ms", type=int, default=50)
    parser.add_argument("--api-delay-ms", type=int, default=0)
    parser.add_argument("--expires-in", type=int, default=3600)
    parser.add_argument("--log")
    arguments = parser.parse_args()
    delay = arguments.refresh_delay_ms / 1000
    api_delay = arguments.api_delay_ms / 1000
    expires_in = arguments.expires_in
    credentials_path = arguments.credentials
    if arguments.log:
        log_file = open(arguments.log, "a")
    write_credentials()
    server = ThreadingHTTPServer(("127.0.0.1", arguments.port), Handler)
    server.daemon_threads = True
    print("listening %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
