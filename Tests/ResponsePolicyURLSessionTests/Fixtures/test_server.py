#!/usr/bin/env python3
"""A small HTTP server that plays an API plus an OAuth 2.0 token endpoint for integration tests.

Standard library only. Start it with `python3 test_server.py`; it binds 127.0.0.1 on an ephemeral
port, prints `PORT <n>` as its first line of stdout, and serves until its stdin closes (so it never
outlives the test process that started it), it gets SIGTERM, or HARD_TIMEOUT seconds pass.

Routes
  GET  /api/*         200 {"status":0,"data":"ok"} for `Authorization: Bearer <access_token>`;
                      any other token (old, unknown or missing) is "expired": 200 {"status":1401}
                      or 401 with WWW-Authenticate, per `expired_mode`; `api_mode` "logout" answers
                      200 {"status":202} to everything; "logout_during_refresh" answers the first
                      call as "normal" does and holds every later one until a token call is in
                      flight, then answers it 200 {"status":202} (a logout landing mid-refresh).
  POST /oauth/token   RFC 6749 §6 refresh_token grant (form-encoded). A valid refresh token gets a
                      new access token and a rotated refresh token (the old one stops working);
                      anything else, or `token_mode` "invalid_grant", gets 400 {"error":"invalid_grant"}.
                      Sleeps `token_delay` seconds first so concurrent refreshes pile up, and
                      waits while `token_gate` is "closed" (a test acts while a refresh is in flight).
  GET  /flaky/503     503 with `Retry-After: <retry_after>` for the next `flaky_count` requests, then 200.
  GET  /drop          For the next `drop_count` requests: headers promising more body than is sent,
                      then the connection is closed. Then 200.
  *    /close         Reads the request (its body too) and closes the connection without a byte of answer.
  *    /reset-before-body  The first call: resets the connection after the head, its body unread (the
                      client's send fails midway); later calls answer {"received": <body length>}.
  GET  /stall         Sleeps `stall_seconds` (or `?seconds=` if given) and then answers 200.
  POST /logout        Counts a logout and answers 200 {"status":0}.
  *    /echo          Answers 200 with the request as JSON: method, path, query, headers (ordered
                      [name, value] pairs), body (UTF-8 text) and body_base64.
  *    /redirect      Answers `?status=` (302 by default) with `Location: <?to=>` (with `?loop=1`: itself).
  GET  /big           (and HEAD) 200 with `?bytes=` bytes of "a", in 64 KiB chunks; with `?length=0` no Content-Length
                      (the body ends when the connection closes).
  GET  /bomb          200 with `?bytes=` bytes of zeros compressed with `?encoding=` (gzip by default, or deflate),
                      `Content-Encoding` set: a few KiB on the wire for many MiB decoded.
  GET  /endless       200 chunked, 64 KiB chunks of "a" (one a millisecond; `?pace=0`: as fast as the
                      socket takes them) until the client goes away or 60 s pass (a body with no end).
  GET  /headers       200 with `?count=` header fields `X-Field-<i>: <i>` and an empty JSON body.
  GET  /_requests     Every request this server received (but /_*): [{method, path, query, headers, body}].
  POST /_control      JSON object; sets any keys of DEFAULT_CONFIG (unknown keys are a 400), or with
                      "reset": true first restores defaults and zeroes counters. Answers like /_stats.
  GET  /_stats        {"counters": {COUNTERS...}, "config": {DEFAULT_CONFIG keys...}, "access_token": ...,
                      "refresh_token": ..., "flaky_remaining": n, "drop_remaining": n}.
"""

import base64
import io
import json
import os
import socket
import struct
import sys
import threading
import time
import urllib.parse
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HARD_TIMEOUT = 300.0

DEFAULT_CONFIG = {
    "access_token": "access-0",  # the one access token /api/* accepts; null: none is valid
    "refresh_token": "refresh-0",  # the one refresh token /oauth/token accepts; null: none is valid
    "client_id": None,  # when set, /oauth/token answers 401 invalid_client to any other client_id
    "api_mode": "normal",  # "normal" | "logout" | "logout_during_refresh"
    "expired_mode": "status1401",  # "status1401" (200 {"status":1401}) | "http401"
    "token_mode": "normal",  # "normal" | "invalid_grant"
    "token_delay": 0.0,  # seconds /oauth/token waits before answering
    "token_gate": "open",  # "closed": /oauth/token holds every call (at most 30 s) until set "open" again
    "expires_in": 3600,  # seconds, as reported in token responses
    "flaky_count": 1,  # how many of the next /flaky/503 requests get a 503
    "retry_after": 1,  # the Retry-After value (seconds) on those 503s
    "drop_count": 1,  # how many of the next /drop requests get a truncated response
    "stall_seconds": 2.0,  # how long /stall waits
    "api_delay": 0.0,  # seconds /api/* waits before answering (a fetch that lasts, for a scraper to see)
}

COUNTERS = (
    "api_calls", "api_ok", "api_expired", "api_logout",
    "token_calls", "token_ok", "token_rejected", "token_in_flight_max",
    "flaky_calls", "drop_calls", "reset_before_body_calls", "stall_calls", "logout_calls", "echo_calls", "control_calls",
    "redirect_calls", "big_calls",
)


class State:
    """Scenario state shared by all handler threads; every access holds `lock`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.token_started = threading.Condition(self.lock)  # notified when a token call begins
        self.reset()

    def reset(self):
        self.config = dict(DEFAULT_CONFIG)
        self.counters = {name: 0 for name in COUNTERS}
        self.flaky_remaining = self.config["flaky_count"]
        self.drop_remaining = self.config["drop_count"]
        self.generation = 0  # tokens issued so far; new tokens are access-<n>, refresh-<n>
        self.token_in_flight = 0
        self.requests = []  # every request received, but /_* (see /_requests)

    def apply(self, update):
        """Applies a /_control body; returns an error message, or None. Nothing changes on error."""
        unknown = sorted(set(update) - set(DEFAULT_CONFIG) - {"reset"})
        if unknown:
            return "unknown keys: " + ", ".join(unknown)
        try:
            for key in ("flaky_count", "drop_count", "expires_in", "retry_after"):
                int(update.get(key, 0))
            for key in ("token_delay", "stall_seconds"):
                float(update.get(key, 0))
        except (TypeError, ValueError) as error:
            return "bad value: %s" % error
        if update.get("reset"):
            self.reset()
        for key, value in update.items():
            if key != "reset":
                self.config[key] = value
        self.token_started.notify_all()  # a token call waiting at the gate looks again
        if "flaky_count" in update:
            self.flaky_remaining = int(update["flaky_count"])
        if "drop_count" in update:
            self.drop_remaining = int(update["drop_count"])
        return None

    def snapshot(self):
        return {
            "counters": dict(self.counters),
            "config": dict(self.config),
            "access_token": self.config["access_token"],
            "refresh_token": self.config["refresh_token"],
            "flaky_remaining": self.flaky_remaining,
            "drop_remaining": self.drop_remaining,
        }


STATE = State()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "PolicyTestServer/1"
    # The head and the body go out in two writes: with Nagle's algorithm a kept-alive connection
    # waits for the client's delayed ACK (40 ms) between them.
    disable_nagle_algorithm = True

    def log_message(self, format, *args):  # keep test output quiet
        pass

    # -- plumbing ---------------------------------------------------------------------------------

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def send(self, status, payload, headers=()):
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def bump(self, counter):
        with STATE.lock:
            STATE.counters[counter] += 1

    def dispatch(self):
        url = urllib.parse.urlsplit(self.path)
        self.route_path, self.query = url.path, urllib.parse.parse_qs(url.query)
        if self.route_path == "/reset-before-body" and self.reset_before_body():
            return
        self.body = self.read_body()
        if not self.route_path.startswith("/_"):
            with STATE.lock:
                STATE.requests.append({
                    "method": self.command,
                    "path": self.route_path,
                    "query": url.query,
                    "headers": [[name, value] for name, value in self.headers.items()],
                    "body": self.body.decode("utf-8", "replace"),
                })
        routes = {
            ("POST", "/_control"): self.control,
            ("GET", "/_stats"): self.stats,
            ("POST", "/oauth/token"): self.token,
            ("GET", "/flaky/503"): self.flaky,
            ("GET", "/drop"): self.drop,
            ("GET", "/stall"): self.stall,
            ("POST", "/logout"): self.logout,
            ("GET", "/big"): self.big,
            ("HEAD", "/big"): self.big,
            ("GET", "/_requests"): self.requests,
            ("GET", "/bomb"): self.bomb,
            ("GET", "/endless"): self.endless,
            ("GET", "/headers"): self.many_headers,
        }
        try:
            if self.route_path == "/echo":
                self.echo()
            elif self.route_path == "/reset-before-body":
                self.send(200, {"received": len(self.body)})
            elif self.route_path == "/close":
                self.close_connection = True
            elif self.route_path == "/redirect":
                self.redirect()
            elif self.route_path.startswith("/api/") and self.command == "GET":
                self.api()
            elif (self.command, self.route_path) in routes:
                routes[(self.command, self.route_path)]()
            else:
                self.send(404, {"error": "not_found", "path": self.route_path})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (timeout, cancellation): fine

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = dispatch

    # -- routes -----------------------------------------------------------------------------------

    def control(self):
        try:
            update = json.loads(self.body or b"{}")
            if not isinstance(update, dict):
                raise ValueError("body must be a JSON object")
        except ValueError as error:
            self.send(400, {"error": str(error)})
            return
        with STATE.lock:
            STATE.counters["control_calls"] += 1
            error = STATE.apply(update)
            snapshot = STATE.snapshot()
        self.send(400 if error else 200, {"error": error} if error else snapshot)

    def stats(self):
        with STATE.lock:
            snapshot = STATE.snapshot()
        self.send(200, snapshot)

    def api(self):
        authorization = self.headers.get("Authorization", "")
        with STATE.lock:
            delay = STATE.config["api_delay"]
        if delay > 0:
            time.sleep(delay)
        with STATE.lock:
            STATE.counters["api_calls"] += 1
            later = STATE.counters["api_calls"] > 1
            config = dict(STATE.config)
            current = config["access_token"]
            if config["api_mode"] == "logout":
                outcome = "logout"
            elif config["api_mode"] == "logout_during_refresh" and later:
                STATE.token_started.wait_for(lambda: STATE.token_in_flight > 0, timeout=10)
                outcome = "logout"
            elif current is not None and authorization == "Bearer " + current:
                outcome = "ok"
            else:
                outcome = "expired"
            STATE.counters["api_" + outcome] += 1
        if outcome == "logout":
            self.send(200, {"status": 202})
        elif outcome == "ok":
            self.send(200, {"status": 0, "data": "ok"})
        elif config["expired_mode"] == "http401":
            challenge = 'Bearer error="invalid_token", error_description="The access token expired"'
            self.send(401, {"error": "invalid_token"}, [("WWW-Authenticate", challenge)])
        else:
            self.send(200, {"status": 1401})

    def token(self):
        with STATE.lock:
            STATE.counters["token_calls"] += 1
            STATE.token_in_flight += 1
            STATE.token_started.notify_all()
            STATE.counters["token_in_flight_max"] = max(
                STATE.counters["token_in_flight_max"], STATE.token_in_flight)
            delay = float(STATE.config["token_delay"])
        try:
            if delay > 0:
                time.sleep(delay)
            with STATE.lock:
                STATE.token_started.wait_for(lambda: STATE.config["token_gate"] == "open", timeout=30)
            form = urllib.parse.parse_qs(self.body.decode("utf-8", "replace"))
            field = lambda name: (form.get(name) or [None])[0]  # noqa: E731
            with STATE.lock:
                config = STATE.config
                if field("grant_type") != "refresh_token":
                    status, payload = 400, {"error": "unsupported_grant_type"}
                elif config["client_id"] is not None and field("client_id") != config["client_id"]:
                    status, payload = 401, {"error": "invalid_client"}
                elif (config["token_mode"] == "invalid_grant" or config["refresh_token"] is None
                      or field("refresh_token") != config["refresh_token"]):
                    status, payload = 400, {"error": "invalid_grant"}
                else:
                    STATE.generation += 1
                    config["access_token"] = "access-%d" % STATE.generation
                    config["refresh_token"] = "refresh-%d" % STATE.generation
                    status, payload = 200, {
                        "access_token": config["access_token"],
                        "token_type": "Bearer",
                        "expires_in": config["expires_in"],
                        "refresh_token": config["refresh_token"],
                    }
                STATE.counters["token_ok" if status == 200 else "token_rejected"] += 1
            # RFC 6749 §5.1: token responses must not be cached.
            self.send(status, payload, [("Cache-Control", "no-store"), ("Pragma", "no-cache")])
        finally:
            with STATE.lock:
                STATE.token_in_flight -= 1

    def flaky(self):
        with STATE.lock:
            STATE.counters["flaky_calls"] += 1
            fail = STATE.flaky_remaining > 0
            STATE.flaky_remaining -= 1 if fail else 0
            retry_after = str(STATE.config["retry_after"])
        if fail:
            self.send(503, {"error": "unavailable"}, [("Retry-After", retry_after)])
        else:
            self.send(200, {"status": 0, "data": "ok"})

    def reset_before_body(self):
        """The first call: the connection is reset (RST) after the head, the body unread, so the
        client's send fails midway. Returns whether it did."""
        with STATE.lock:
            STATE.counters["reset_before_body_calls"] += 1
            first = STATE.counters["reset_before_body_calls"] == 1
        if not first:
            return False
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True
        self.wfile = io.BytesIO()  # nothing to flush on the closed socket
        return True

    def drop(self):
        with STATE.lock:
            STATE.counters["drop_calls"] += 1
            fail = STATE.drop_remaining > 0
            STATE.drop_remaining -= 1 if fail else 0
        if not fail:
            self.send(200, {"status": 0, "data": "ok"})
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b'{"status":0,"da')
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def stall(self):
        self.bump("stall_calls")
        with STATE.lock:
            seconds = float(STATE.config["stall_seconds"])
        if "seconds" in self.query:
            seconds = float(self.query["seconds"][0])
        time.sleep(seconds)
        self.send(200, {"status": 0, "data": "stalled", "seconds": seconds})

    def logout(self):
        self.bump("logout_calls")
        self.send(200, {"status": 0})

    def redirect(self):
        self.bump("redirect_calls")
        status = int((self.query.get("status") or ["302"])[0])
        target = (self.query.get("to") or ["/echo"])[0]
        if "loop" in self.query:
            target = self.path  # itself, forever
        self.send(status, {"redirect": target}, [("Location", target)])

    def big(self):
        self.bump("big_calls")
        size = int((self.query.get("bytes") or ["0"])[0])
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if (self.query.get("length") or ["1"])[0] != "0":
            self.send_header("Content-Length", str(size))
        else:
            self.close_connection = True
        self.end_headers()
        chunk = b"a" * 65536
        while size > 0 and self.command != "HEAD":
            self.wfile.write(chunk[:min(size, len(chunk))])
            size -= len(chunk)
        self.wfile.flush()

    def bomb(self):
        self.bump("big_calls")
        size = int((self.query.get("bytes") or ["0"])[0])
        encoding = (self.query.get("encoding") or ["gzip"])[0]
        compressor = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
        zeros = bytes(1 << 20)
        parts = []
        while size > 0:
            parts.append(compressor.compress(zeros[:min(size, len(zeros))]))
            size -= len(zeros)
        parts.append(compressor.flush())
        payload = b"".join(parts)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def endless(self):
        self.bump("big_calls")
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b"10000\r\n" + b"a" * 65536 + b"\r\n"
        pace = (self.query.get("pace") or ["1"])[0] != "0"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.wfile.write(chunk)
            # About 64 MiB/s, slower than a client drains loopback: at full speed the socket never
            # empties, and FoundationNetworking's one work queue (every session of the process)
            # stays in libcurl's read loop, so nothing cancels the task until the 60 s are over.
            if pace:
                time.sleep(0.001)
        self.close_connection = True

    def many_headers(self):
        count = int((self.query.get("count") or ["0"])[0])
        lines = ["HTTP/1.1 200 OK", "Content-Type: application/json", "Content-Length: 2"]
        lines += ["X-Field-%d: %d" % (index, index) for index in range(count)]
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n{}").encode())
        self.wfile.flush()

    def requests(self):
        with STATE.lock:
            received = list(STATE.requests)
        self.send(200, received)

    def echo(self):
        self.bump("echo_calls")
        self.send(200, {
            "method": self.command,
            "path": self.route_path,
            "query": {name: values for name, values in self.query.items()},
            "headers": [[name, value] for name, value in self.headers.items()],
            "body": self.body.decode("utf-8", "replace"),
            "body_base64": base64.b64encode(self.body).decode("ascii"),
        })


def main():
    # A listen backlog for bursts of new connections (URLSession on Linux opens one per POST).
    ThreadingHTTPServer.request_queue_size = 256
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # Never outlive the test run, even if nobody closes stdin.
    watchdog = threading.Timer(HARD_TIMEOUT, lambda: os._exit(2))
    watchdog.daemon = True
    watchdog.start()
    sys.stdout.write("PORT %d\n" % server.server_address[1])
    sys.stdout.flush()
    while sys.stdin.buffer.read(4096):  # returns b"" once the parent closes stdin or dies
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
