#!/usr/bin/env python3
"""A loopback server for the credential-source tests: an OAuth 2.0 token endpoint with every grant,
a JSON login endpoint, and an API that accepts only the newest token.

Standard library only. Binds 127.0.0.1 on an ephemeral port, prints `PORT <n>` first, and serves
until its stdin closes, it gets SIGTERM, or HARD_TIMEOUT seconds pass.

Routes
  POST /token     RFC 6749 token endpoint. grant_type refresh_token | client_credentials | password.
                  The client authenticates as `client_auth` says ("client_secret_basic": HTTP Basic;
                  "client_secret_post": client_id and client_secret in the form); a wrong or missing
                  secret is 401 invalid_client. password: `username`/`password` must match, else
                  400 invalid_grant. Issues access-<n> (and refresh-<n>) and makes it the one /api
                  accepts. Sleeps `token_delay` first. Records the last form's non-secret fields.
  POST /login     JSON {"username","password"} matching the config: 200 {"auth_token": "login-<n>"};
                  else 401 {"error":"bad credentials"}.
  GET  /api/*     200 {"ok":true} when the request carries the current token, as
                  `Authorization: Bearer <t>` or `auth_token: <t>`; else 401. Records how many
                  auth_token headers each request carried.
  POST /_control  JSON object: sets config keys ("reset": true restores defaults first).
  GET  /_stats    {"counters": {...}, "last_form": {...}, "auth_token_headers": [n, ...], "token": t}
"""

import base64
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HARD_TIMEOUT = 300.0

DEFAULT_CONFIG = {
    "client_id": "svc",
    "client_secret": "s3cr3t-client-value",
    "client_auth": "client_secret_basic",
    "username": "alice",
    "password": "pa55-word-value",
    "token_delay": 0.0,
    "expires_in": 3600,
    "issue_refresh_token": False,
    "token": None,  # the token /api accepts; None: none yet
}


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.config = dict(DEFAULT_CONFIG)
        self.counters = {"token_calls": 0, "token_ok": 0, "login_calls": 0, "api_calls": 0, "api_ok": 0}
        self.generation = 0
        self.last_form = {}
        self.auth_token_headers = []
        self.refresh_token = None


STATE = State()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def send(self, status, payload):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def do_GET(self):
        path = urllib.parse.urlsplit(self.path).path
        if path == "/_stats":
            with STATE.lock:
                self.send(200, {"counters": STATE.counters, "last_form": STATE.last_form,
                                "auth_token_headers": STATE.auth_token_headers, "token": STATE.config["token"]})
        elif path.startswith("/api/"):
            tokens = self.headers.get_all("auth_token") or []
            authorization = self.headers.get("Authorization", "")
            with STATE.lock:
                STATE.counters["api_calls"] += 1
                STATE.auth_token_headers.append(len(tokens))
                current = STATE.config["token"]
                ok = current is not None and (authorization == "Bearer " + current or tokens == [current])
                if ok:
                    STATE.counters["api_ok"] += 1
            self.send(200 if ok else 401, {"ok": True} if ok else {"error": "invalid_token"})
        else:
            self.send(404, {"error": "not_found"})

    def do_POST(self):
        path = urllib.parse.urlsplit(self.path).path
        body = self.body()
        if path == "/_control":
            update = json.loads(body or b"{}")
            with STATE.lock:
                if update.pop("reset", False):
                    STATE.reset()
                STATE.config.update(update)
            self.send(200, {"ok": True})
        elif path == "/token":
            self.token(urllib.parse.parse_qs(body.decode("utf-8", "replace")))
        elif path == "/login":
            self.login(body)
        else:
            self.send(404, {"error": "not_found"})

    def token(self, form):
        field = lambda name: (form.get(name) or [None])[0]  # noqa: E731
        with STATE.lock:
            STATE.counters["token_calls"] += 1
            delay = float(STATE.config["token_delay"])
            config = dict(STATE.config)
            STATE.last_form = {key: values[0] for key, values in form.items()
                               if key not in ("client_secret", "password", "refresh_token")}
            STATE.last_form["authorization"] = "basic" if self.headers.get("Authorization") else "none"
        if delay > 0:
            time.sleep(delay)
        # Client authentication.
        client_id, secret = field("client_id"), None
        header = self.headers.get("Authorization", "")
        if config["client_auth"] == "client_secret_basic":
            if header.startswith("Basic "):
                pair = base64.b64decode(header[6:]).decode()
                basic_id, _, secret = pair.partition(":")
                client_id = urllib.parse.unquote_plus(basic_id)
                secret = urllib.parse.unquote_plus(secret)
        else:
            secret = field("client_secret")
        if client_id != config["client_id"] or secret != config["client_secret"]:
            self.send(401, {"error": "invalid_client"})
            return
        grant = field("grant_type")
        with STATE.lock:
            if grant == "client_credentials":
                ok = True
            elif grant == "password":
                ok = field("username") == config["username"] and field("password") == config["password"]
            elif grant == "refresh_token":
                ok = STATE.refresh_token is not None and field("refresh_token") == STATE.refresh_token
            else:
                self.send(400, {"error": "unsupported_grant_type"})
                return
            if not ok:
                self.send(400, {"error": "invalid_grant"})
                return
            STATE.generation += 1
            token = "access-%d" % STATE.generation
            STATE.config["token"] = token
            STATE.counters["token_ok"] += 1
            answer = {"access_token": token, "token_type": "Bearer", "expires_in": config["expires_in"]}
            if config["issue_refresh_token"]:
                STATE.refresh_token = "refresh-%d" % STATE.generation
                answer["refresh_token"] = STATE.refresh_token
        self.send(200, answer)

    def login(self, body):
        try:
            credentials = json.loads(body or b"{}")
        except ValueError:
            credentials = {}
        with STATE.lock:
            STATE.counters["login_calls"] += 1
            config = STATE.config
            if credentials.get("username") != config["username"] or credentials.get("password") != config["password"]:
                ok = False
            else:
                ok = True
                STATE.generation += 1
                config["token"] = "login-%d" % STATE.generation
                token = config["token"]
        self.send(200 if ok else 401, {"auth_token": token} if ok else {"error": "bad credentials"})


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    watchdog = threading.Timer(HARD_TIMEOUT, lambda: os._exit(2))
    watchdog.daemon = True
    watchdog.start()
    sys.stdout.write("PORT %d\n" % server.server_address[1])
    sys.stdout.flush()
    while sys.stdin.buffer.read(4096):
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
