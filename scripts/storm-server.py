#!/usr/bin/env python3
"""The loopback API and token endpoint of `policy-bench --only storm-http`.

Standard library only. Binds 127.0.0.1 on an ephemeral port, prints `PORT <n>` as its first line,
and serves until its stdin closes (it never outlives the benchmark), SIGTERM, or 15 minutes.

  GET  /api/*        200 {"status":0,"seq":n} for `Authorization: Bearer <current access token>`;
                     any other token is expired: 401, or 200 {"status":1401} (`expired`).
                     With `logout_after` = k: once k requests were answered OK, the next one is
                     answered 200 {"status":202} instead (a session revoked mid-storm). An OK
                     answer counts as answered before the 202 when its last byte was written
                     before the 202's first; requests arriving after the 202 are listed by path.
  POST /oauth/token  refresh_token grant: a new access and refresh token (rotated).
  POST /_reset       JSON {"expired": "401"|"1401", "logout_after": k|null, "token": "valid"|"expired"}:
                     zeroes the counters and sets the scenario.
  GET  /_stats       {"api_calls", "token_calls", "ok", "rejected", "lag_ms" (first rejection
                     answered -> first token call arrived), "ok_before_202": [seq...],
                     "arrivals_after_202": [path...]}.

Refresh lag is measured here, at the server, as the issue defines it: from the moment the first
request with the stale token is answered to the moment the token call arrives.
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset({})

    def reset(self, scenario):
        self.expired = str(scenario.get("expired", "401"))
        self.logout_after = scenario.get("logout_after")
        self.generation = 0
        valid = scenario.get("token", "expired") == "valid"
        self.access = "access-0" if valid else "access-1"  # the client starts with access-0
        self.refresh = "refresh-0"
        self.api_calls = 0
        self.token_calls = 0
        self.ok = 0
        self.rejected = 0
        self.first_rejection = None
        self.first_token = None
        self.written = []  # seqs of OK answers written in full, in order
        self.ok_before_202 = []
        self.logout_at = None
        self.arrivals_after_202 = []

    def stats(self):
        lag = None
        if self.first_rejection is not None and self.first_token is not None:
            lag = (self.first_token - self.first_rejection) * 1000.0
        return {
            "api_calls": self.api_calls, "token_calls": self.token_calls, "ok": self.ok,
            "rejected": self.rejected, "lag_ms": lag, "ok_before_202": self.ok_before_202,
            "arrivals_after_202": self.arrivals_after_202,
        }


STATE = State()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def answer(self, status, payload, headers=()):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def do_GET(self):
        if self.path == "/_stats":
            with STATE.lock:
                stats = STATE.stats()
            return self.answer(200, stats)
        if not self.path.startswith("/api/"):
            return self.answer(404, {"error": "not found"})
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        with STATE.lock:
            STATE.api_calls += 1
            if STATE.logout_at is not None:
                STATE.arrivals_after_202.append(self.path)
            if token != STATE.access:
                STATE.rejected += 1
                if STATE.first_rejection is None:
                    STATE.first_rejection = time.monotonic()
                expired = STATE.expired
                reply = None
            elif STATE.logout_after is not None and STATE.logout_at is None and STATE.ok >= STATE.logout_after:
                STATE.logout_at = time.time()
                # Answered before the 202: every OK answer whose last byte is already written.
                STATE.ok_before_202 = list(STATE.written)
                reply = (200, {"status": 202})
            else:
                STATE.ok += 1
                seq = STATE.ok
                reply = (200, {"status": 0, "seq": seq})
        if reply is None:
            if expired == "401":
                return self.answer(401, {"error": "expired"}, [("WWW-Authenticate", "Bearer")])
            return self.answer(200, {"status": 1401})
        self.answer(*reply)
        if "seq" in reply[1]:
            with STATE.lock:
                STATE.written.append(reply[1]["seq"])

    def do_POST(self):
        if self.path == "/_reset":
            scenario = json.loads(self.body() or b"{}")
            with STATE.lock:
                STATE.reset(scenario)
            return self.answer(200, {"ok": True})
        if self.path != "/oauth/token":
            self.body()
            return self.answer(404, {"error": "not found"})
        with STATE.lock:
            STATE.token_calls += 1
            if STATE.first_token is None:
                STATE.first_token = time.monotonic()
        form = dict(
            pair.split("=", 1) for pair in self.body().decode().split("&") if "=" in pair)
        with STATE.lock:
            if form.get("refresh_token") != STATE.refresh:
                reply = (400, {"error": "invalid_grant"})
            else:
                STATE.generation += 1
                STATE.access = "access-new-%d" % STATE.generation
                STATE.refresh = "refresh-new-%d" % STATE.generation
                reply = (200, {"access_token": STATE.access, "refresh_token": STATE.refresh,
                               "token_type": "Bearer", "expires_in": 3600})
        self.answer(*reply)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 4096

    def handle_error(self, request, client_address):
        pass  # a connection the client closed (a cancelled attempt) is not news


def main():
    server = Server(("127.0.0.1", 0), Handler)
    print("PORT %d" % server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    deadline = time.monotonic() + 900
    # Serves until stdin closes: the benchmark's end, however it ends.
    reader = threading.Thread(target=sys.stdin.read, daemon=True)
    reader.start()
    while reader.is_alive() and time.monotonic() < deadline:
        reader.join(0.5)
    server.shutdown()


if __name__ == "__main__":
    main()
