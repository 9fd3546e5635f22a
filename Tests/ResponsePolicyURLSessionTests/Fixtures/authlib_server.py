#!/usr/bin/env python3
"""An OAuth 2.0 authorization server built from Authlib's own grant classes, plus an API.

Needs Authlib and Flask (`.ci/run` installs them into `.build/authlib-venv`). Start it with
`python authlib_server.py [EXPIRES_IN] [IDLE_RESET]`: it binds 127.0.0.1 on an ephemeral port,
prints `PORT <n>` first, and serves until its stdin closes or HARD_TIMEOUT passes.

- Token endpoint `POST /oauth/token`: Authlib's AuthorizationServer with its RefreshTokenGrant
  (rotation on: a new refresh token each time, the old token, access and refresh, revoked), its
  ClientCredentialsGrant and its ResourceOwnerPasswordCredentialsGrant. Tokens live EXPIRES_IN
  seconds (1 by default). Clients: `basic` (client_secret_basic, secret `basic-secret`), `post`
  (client_secret_post, secret `post-secret`), `spaced` (client_secret_basic, secret
  `secret with space`, which Authlib decodes with `unquote`: sent form-encoded it fails). User
  `alice`, password `wonderland`.
- `GET /api/me`: 200 `{"status":0}` for a live access token, 401 otherwise.
- Keep-alive (`keepalive.py`, shared with dot_server.py): HTTP/1.1; a connection idle for
  IDLE_RESET seconds (0.3 by default; 0: never) is reset with an RST when the next request
  arrives on it (gunicorn's keep-alive timeout, made certain).
- `POST /_control` (JSON): `transient_every` n makes every n-th token call answer
  `transient_status` (503) with `Retry-After: retry_after` instead of asking Authlib;
  `transient_first` n makes the next n token calls answer so (an outage); `answer_overrides`
  (an object) replaces fields of every token Authlib issues in the answer the client sees (an odd
  `expires_in`, a `token_type` of `mac`, an `access_token` with a newline), the pair stays issued.
- `GET /api/admin`: for a live access token, 401 with `WWW-Authenticate: Bearer
  error="insufficient_scope"` (the token lacks the `admin` scope; RFC 6750 §3.1).
- `GET /_stats`: token calls, tokens issued, refresh tokens presented twice, transient answers
  given, idle resets (and those of them that met a token call), requests dropped because the
  client closed before their whole body came (`cut`), API answers by status.
"""

import json
import os
import secrets
import sys
import threading
import time

from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import ClientMixin, TokenMixin, grants
from flask import Flask, jsonify, request
from wsgiref.simple_server import make_server

from keepalive import ThreadingServer, resetting_handler

HARD_TIMEOUT = 300.0
EXPIRES_IN = int(sys.argv[1]) if len(sys.argv) > 1 else 1
IDLE_RESET = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3

lock = threading.Lock()
stats = {
    "token_calls": 0,
    "issued": 0,
    "refresh_reused": 0,
    "transient_answers": 0,
    "resets": 0,
    "token_resets": 0,
    "cut": 0,
    "api_ok": 0,
    "api_401": 0,
    "api_scope_401": 0,
    "last_refresh_token": None,
}
control = {"transient_every": 0, "transient_status": 503, "retry_after": 0, "transient_first": 0, "answer_overrides": {}}
tokens_by_access = {}
tokens_by_refresh = {}
presented_refresh = set()


class Client(ClientMixin):
    def __init__(self, client_id, secret, method, grants_allowed):
        self.client_id = client_id
        self.secret = secret
        self.method = method
        self.grants_allowed = grants_allowed

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return None

    def get_allowed_scope(self, scope):
        return scope or ""

    def check_redirect_uri(self, redirect_uri):
        return False

    def check_client_secret(self, client_secret):
        return secrets.compare_digest(client_secret, self.secret)

    def check_endpoint_auth_method(self, method, endpoint):
        return method == self.method

    def check_response_type(self, response_type):
        return False

    def check_grant_type(self, grant_type):
        return grant_type in self.grants_allowed


ALL_GRANTS = ["refresh_token", "client_credentials", "password"]
CLIENTS = {
    "basic": Client("basic", "basic-secret", "client_secret_basic", ALL_GRANTS),
    "post": Client("post", "post-secret", "client_secret_post", ALL_GRANTS),
    "spaced": Client("spaced", "secret with space", "client_secret_basic", ALL_GRANTS),
}


class User:
    def __init__(self, name):
        self.name = name

    def get_user_id(self):
        return self.name


class Token(TokenMixin):
    def __init__(self, client_id, user, data):
        self.client_id = client_id
        self.user = user
        self.access_token = data["access_token"]
        self.refresh_token = data.get("refresh_token")
        self.scope = data.get("scope", "")
        self.expires_in = data["expires_in"]
        self.issued_at = time.time()
        self.revoked = False

    def check_client(self, client):
        return client.get_client_id() == self.client_id

    def get_scope(self):
        return self.scope

    def get_expires_in(self):
        return self.expires_in

    def is_revoked(self):
        return self.revoked

    def is_expired(self):
        return time.time() >= self.issued_at + self.expires_in

    def is_live(self):
        return not self.revoked and not self.is_expired()


class RefreshTokenGrant(grants.RefreshTokenGrant):
    INCLUDE_NEW_REFRESH_TOKEN = True
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]

    def authenticate_refresh_token(self, refresh_token):
        with lock:
            if refresh_token in presented_refresh:
                stats["refresh_reused"] += 1
            presented_refresh.add(refresh_token)
            token = tokens_by_refresh.get(refresh_token)
        if token is not None and not token.revoked:
            return token
        return None

    def authenticate_user(self, refresh_token):
        return refresh_token.user

    def revoke_old_credential(self, refresh_token):
        # Rotation: the old pair, access token included, stops working now.
        with lock:
            refresh_token.revoked = True


class PasswordGrant(grants.ResourceOwnerPasswordCredentialsGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]

    def authenticate_user(self, username, password):
        if username == "alice" and password == "wonderland":
            return User(username)
        return None


class ClientCredentialsGrant(grants.ClientCredentialsGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]


def query_client(client_id):
    return CLIENTS.get(client_id)


def save_token(data, req):
    user = req.user if getattr(req, "user", None) is not None else None
    token = Token(req.client.get_client_id(), user, data)
    with lock:
        tokens_by_access[token.access_token] = token
        if token.refresh_token:
            tokens_by_refresh[token.refresh_token] = token
            stats["last_refresh_token"] = token.refresh_token
        stats["issued"] += 1


app = Flask(__name__)
app.config["OAUTH2_TOKEN_EXPIRES_IN"] = {
    "refresh_token": EXPIRES_IN,
    "client_credentials": EXPIRES_IN,
    "password": EXPIRES_IN,
}
app.config["OAUTH2_REFRESH_TOKEN_GENERATOR"] = True
server = AuthorizationServer(app, query_client=query_client, save_token=save_token)
server.register_grant(RefreshTokenGrant)
server.register_grant(PasswordGrant)
server.register_grant(ClientCredentialsGrant)


@app.route("/oauth/token", methods=["POST"])
def issue_token():
    with lock:
        stats["token_calls"] += 1
        every = control["transient_every"]
        transient = every > 0 and stats["token_calls"] % every == 0
        if control["transient_first"] > 0:
            control["transient_first"] -= 1
            transient = True
        if transient:
            stats["transient_answers"] += 1
        overrides = dict(control["answer_overrides"])
    if transient:
        response = jsonify({"error": "temporarily_unavailable"})
        response.status_code = control["transient_status"]
        response.headers["Retry-After"] = str(control["retry_after"])
        return response
    response = server.create_token_response()
    if overrides and response.status_code == 200:
        answer = json.loads(response.get_data())
        answer.update(overrides)
        response.set_data(json.dumps(answer))
    return response


@app.route("/api/me")
def me():
    header = request.headers.get("Authorization", "")
    token = tokens_by_access.get(header[len("Bearer "):]) if header.startswith("Bearer ") else None
    if token is None or not token.is_live():
        with lock:
            stats["api_401"] += 1
        return jsonify({"error": "invalid_token"}), 401
    with lock:
        stats["api_ok"] += 1
    return jsonify({"status": 0})


@app.route("/api/admin")
def admin():
    header = request.headers.get("Authorization", "")
    token = tokens_by_access.get(header[len("Bearer "):]) if header.startswith("Bearer ") else None
    if token is None or not token.is_live():
        with lock:
            stats["api_401"] += 1
        return jsonify({"error": "invalid_token"}), 401
    with lock:
        stats["api_scope_401"] += 1
    response = jsonify({"error": "insufficient_scope"})
    response.status_code = 401
    response.headers["WWW-Authenticate"] = 'Bearer realm="api", error="insufficient_scope", scope="admin"'
    return response


@app.route("/_control", methods=["POST"])
def set_control():
    with lock:
        control.update(request.get_json(force=True))
        return jsonify(control)


@app.route("/_stats")
def get_stats():
    with lock:
        return jsonify(stats)


ResettingHandler = resetting_handler(IDLE_RESET, lock, stats, b"POST /oauth/token")


def main():
    httpd = make_server("127.0.0.1", 0, app, server_class=ThreadingServer, handler_class=ResettingHandler)
    print("PORT %d" % httpd.server_port, flush=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    watcher = threading.Thread(target=lambda: sys.stdin.read(), daemon=True)
    watcher.start()
    watcher.join(HARD_TIMEOUT)
    os._exit(0)


if __name__ == "__main__":
    main()
