#!/usr/bin/env python3
"""An OAuth 2.0 authorization server that is glewlwyd itself (Debian's package), plus an API.

Needs glewlwyd (`apt-get install glewlwyd`: the binary, its modules under /usr/lib/glewlwyd and
the SQLite init script under /usr/share/dbconfig-common/data/glewlwyd/install). Standard library
only otherwise. Start it with `python3 glewlwyd_server.py [EXPIRES_IN]`: it makes a config and a
fresh SQLite database (from the package's init script) in a temporary folder, starts glewlwyd on
a free loopback port, sets it up through glewlwyd's own admin API, binds its front (127.0.0.1,
an ephemeral port), prints `PORT <n>` first, and serves until its stdin closes, SIGTERM, or
HARD_TIMEOUT passes; then glewlwyd is stopped and the folder removed.

- glewlwyd's OpenID Connect plugin (`oidc`: its OAuth2 plugin, `glwd`, never rotates refresh
  tokens and takes no client_secret_post) with an HS256 key, access tokens living EXPIRES_IN
  seconds (1 by default, the least glewlwyd takes), `refresh-token-one-use: always` (a refresh
  token is spent when used: the answer carries a new one) and `allow-non-oidc` (no `openid` scope
  needed). Clients, confidential, secrets hashed by glewlwyd (PBKDF2): `basic` (client_secret_basic,
  `basic-secret`), `post` (client_secret_post, `post-secret`), `spaced` (client_secret_basic,
  `secret with space`: glewlwyd does not form-decode a Basic secret, so it is sent raw), all with
  the password and refresh_token grants, and `service` (client_secret_basic, `service-secret`,
  client_credentials). User `alice`, password `wonderland`. A client without the
  `token_endpoint_auth_method` property is refused by the plugin (a 500 for the password grant).
- `POST /token`: glewlwyd's token endpoint (`/api/oidc/token`), forwarded as it is and answered as
  glewlwyd answers (its errors have empty bodies: 400 for a spent refresh token or a wrong
  secret on the refresh grant, 403 for a wrong secret on client credentials), counted.
- `GET /api/me`: 200 `{"status":0}` for an access token glewlwyd signed (HS256, the plugin's key)
  and issued through `/token` less than its `expires_in` ago, measured from the answer (the JWT's
  `exp` is whole seconds from a whole-second `iat`: a 1 s token issued at .9 would live 0.1 s);
  401 with `WWW-Authenticate: Bearer error="invalid_token"` otherwise. glewlwyd's own userinfo
  endpoint refused its fresh tokens here.
- HTTP/1.1 keep-alive (`keepalive.py`, shared with the other authorization-server fixtures).
- `GET /_stats`: token calls, tokens issued, refresh tokens presented more than once
  (`refresh_reused`: a spent token presented again, whatever glewlwyd answered), token calls by
  grant and by client authentication (`basic`, `post`, `none`), token answers by status, API
  answers by status.
"""

import base64
import hashlib
import hmac
import http.client
import json
import os
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from wsgiref.simple_server import make_server

from keepalive import ThreadingServer, resetting_handler

HARD_TIMEOUT = 300.0
EXPIRES_IN = int(sys.argv[1]) if len(sys.argv) > 1 else 1
INIT_SQL = "/usr/share/dbconfig-common/data/glewlwyd/install/sqlite3"
MODULES = "/usr/lib/glewlwyd"
# The HS256 key glewlwyd signs with, which the API checks signatures with.
KEY = "glewlwyd-server-test-only-hs256-key"
ADMIN = ("admin", "password")  # the init script's administrator

CLIENTS = [
    ("basic", "basic-secret", "client_secret_basic", ["password", "refresh_token"]),
    ("post", "post-secret", "client_secret_post", ["password", "refresh_token"]),
    ("spaced", "secret with space", "client_secret_basic", ["password", "refresh_token"]),
    ("service", "service-secret", "client_secret_basic", ["client_credentials"]),
]

lock = threading.Lock()
stats = {
    "token_calls": 0,
    "issued": 0,
    "refresh_reused": 0,
    "grants": {},
    "client_auth": {},
    "token_answers": {},
    "api": {},
    "resets": 0,
    "token_resets": 0,
    "cut": 0,
}
presented = set()
# access token -> monotonic time it stops being accepted
live = {}
glewlwyd = {"port": 0}


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def config_text(port, database):
    return f"""
port={port}
bind_address="127.0.0.1"
external_url="http://127.0.0.1:{port}"
login_url="login.html"
api_prefix="api"
log_mode="console"
log_level="WARNING"
cookie_secure=0
session_expiration=3600
session_key="GLEWLWYD2_SESSION_ID"
admin_session_authentication="cookie"
profile_session_authentication="cookie"
login_api_enabled=true
admin_scope="g_admin"
profile_scope="g_profile"
user_module_path="{MODULES}/user"
client_module_path="{MODULES}/client"
user_auth_scheme_module_path="{MODULES}/scheme"
plugin_module_path="{MODULES}/plugin"
hash_algorithm="SHA512"
database =
{{
  type = "sqlite3"
  path = "{database}"
}};
"""


def plugin_parameters():
    return {
        "iss": "http://127.0.0.1/",
        "jwt-type": "sha",
        "jwt-key-size": "256",
        "key": KEY,
        "access-token-duration": EXPIRES_IN,
        "refresh-token-duration": 3600,
        "refresh-token-rolling": True,
        "refresh-token-one-use": "always",
        "code-duration": 600,
        "allow-non-oidc": True,
        "auth-type-code-enabled": True,
        "auth-type-token-enabled": False,
        "auth-type-id-token-enabled": False,
        "auth-type-none-enabled": False,
        "auth-type-password-enabled": True,
        "auth-type-client-enabled": True,
        "auth-type-refresh-enabled": True,
        "auth-type-device-enabled": False,
    }


def make_database(path):
    """The package's init script, and the OIDC plugin instance (read by glewlwyd at start)."""
    with open(INIT_SQL, encoding="utf-8") as script:
        sql = script.read()
    connection = sqlite3.connect(path)
    try:
        connection.executescript(sql)
        connection.execute(
            "INSERT INTO g_plugin_module_instance (gpmi_module, gpmi_name, gpmi_display_name, gpmi_parameters)"
            " VALUES ('oidc', 'oidc', 'OpenID Connect', ?)",
            (json.dumps(plugin_parameters()),),
        )
        connection.commit()
    finally:
        connection.close()


def die_with_parent():
    # glewlwyd goes when this script goes, however it goes.
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def call(method, where, body=None, headers=None, port=None):
    connection = http.client.HTTPConnection("127.0.0.1", port or glewlwyd["port"], timeout=10)
    try:
        connection.request(method, where, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        connection.close()


def start_glewlwyd(folder):
    """glewlwyd on a free port; tried again on another port if it could not take the one given."""
    binary = shutil.which("glewlwyd") or "/usr/bin/glewlwyd"
    log = open(os.path.join(folder, "glewlwyd.log"), "ab")
    for _ in range(3):
        port = free_port()
        config = os.path.join(folder, "glewlwyd.conf")
        with open(config, "w", encoding="utf-8") as file:
            file.write(config_text(port, os.path.join(folder, "glewlwyd.db")))
        process = subprocess.Popen(
            [binary, f"--config-file={config}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status, _, _ = call("GET", "/api/oidc/.well-known/openid-configuration", port=port)
                if status == 200:
                    glewlwyd["port"] = port
                    return process
            except OSError:
                pass
            time.sleep(0.05)
        stop(process)
    log.close()
    with open(os.path.join(folder, "glewlwyd.log"), "rb") as file:
        sys.stderr.write(file.read()[-4000:].decode("utf-8", "replace"))
    raise SystemExit("glewlwyd did not start")


def stop(process):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def set_up():
    """The user and the clients, through glewlwyd's admin API (it hashes their secrets)."""
    status, headers, _ = call(
        "POST",
        "/api/auth/",
        json.dumps({"username": ADMIN[0], "password": ADMIN[1]}),
        {"Content-Type": "application/json"},
    )
    cookies = [value.split(";", 1)[0] for name, value in headers if name.lower() == "set-cookie"]
    if status != 200 or not cookies:
        raise SystemExit(f"glewlwyd's admin login answered {status}")
    admin = {"Content-Type": "application/json", "Cookie": "; ".join(cookies)}
    things = [("/api/user/", {"username": "alice", "password": "wonderland", "scope": ["openid"], "enabled": True})]
    for client_id, secret, method, grants in CLIENTS:
        things.append(
            (
                "/api/client/",
                {
                    "client_id": client_id,
                    "name": client_id,
                    "confidential": True,
                    "password": secret,
                    "token_endpoint_auth_method": [method],
                    "authorization_type": grants,
                    "redirect_uri": ["http://127.0.0.1/callback"],
                    "scope": ["openid"],
                    "enabled": True,
                },
            )
        )
    for where, thing in things:
        status, _, body = call("POST", where, json.dumps(thing), admin)
        if status != 200:
            raise SystemExit(f"glewlwyd's {where} answered {status}: {body[:200]!r}")


def b64decode(part):
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def signed_by_glewlwyd(token):
    """An HS256 JWT signed with the plugin's key, of type access_token."""
    try:
        head, payload, signature = token.split(".")
        if json.loads(b64decode(head)).get("alg") != "HS256":
            return False
        expected = hmac.new(KEY.encode(), f"{head}.{payload}".encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(expected, b64decode(signature)):
            return False
        return json.loads(b64decode(payload)).get("type") == "access_token"
    except ValueError:
        return False


def count(table, key):
    table[key] = table.get(key, 0) + 1


def token(environ, data):
    form = urllib.parse.parse_qs(data.decode("utf-8", "replace"))
    authorization = environ.get("HTTP_AUTHORIZATION", "")
    with lock:
        stats["token_calls"] += 1
        count(stats["grants"], (form.get("grant_type") or ["?"])[0])
        if authorization.lower().startswith("basic "):
            count(stats["client_auth"], "basic")
        elif "client_secret" in form:
            count(stats["client_auth"], "post")
        else:
            count(stats["client_auth"], "none")
        for refresh in form.get("refresh_token", []):
            if refresh in presented:
                stats["refresh_reused"] += 1
            presented.add(refresh)
    headers = {"Content-Type": environ.get("CONTENT_TYPE") or "application/x-www-form-urlencoded"}
    if authorization:
        headers["Authorization"] = authorization
    status, answer_headers, body = call("POST", "/api/oidc/token", data, headers)
    answered = time.monotonic()
    with lock:
        count(stats["token_answers"], str(status))
        if status == 200:
            try:
                answer = json.loads(body)
            except ValueError:
                answer = {}
            if isinstance(answer, dict) and isinstance(answer.get("access_token"), str):
                stats["issued"] += 1
                live[answer["access_token"]] = answered + float(answer.get("expires_in") or 0)
    kept = [(k, v) for k, v in answer_headers if k.lower() in ("content-type", "cache-control", "pragma")]
    return status, kept, body


def me(environ):
    authorization = environ.get("HTTP_AUTHORIZATION", "")
    bearer = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
    with lock:
        deadline = live.get(bearer)
    if bearer and deadline is not None and time.monotonic() < deadline and signed_by_glewlwyd(bearer):
        status, headers, body = 200, [("Content-Type", "application/json")], b'{"status":0}'
    else:
        status, body = 401, b'{"error":"invalid_token"}'
        headers = [("Content-Type", "application/json"), ("WWW-Authenticate", 'Bearer error="invalid_token"')]
    with lock:
        count(stats["api"], str(status))
    return status, headers, body


REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 500: "Error"}


def app(environ, start_response):
    method = environ["REQUEST_METHOD"]
    where = environ.get("PATH_INFO", "")
    length = int(environ.get("CONTENT_LENGTH") or 0)
    data = environ["wsgi.input"].read(length) if length > 0 else b""
    if where == "/_stats":
        with lock:
            body = json.dumps(stats).encode()
        status, headers = 200, [("Content-Type", "application/json")]
    elif method == "POST" and where == "/token":
        try:
            status, headers, body = token(environ, data)
        except OSError as error:
            status, headers, body = 502, [("Content-Type", "text/plain")], f"glewlwyd: {error}".encode()
    elif where == "/api/me":
        status, headers, body = me(environ)
    else:
        status, headers, body = 404, [("Content-Type", "text/plain")], b"not here"
    start_response(f"{status} {REASONS.get(status, 'Status')}", headers + [("Content-Length", str(len(body)))])
    return [body]


KeepAliveHandler = resetting_handler(0.0, lock, stats, b"POST /token")


def main():
    # The test closes stdin and then terminates: either way glewlwyd and the folder go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    folder = tempfile.mkdtemp(prefix="glewlwyd-server-")
    process = None
    server = None
    try:
        make_database(os.path.join(folder, "glewlwyd.db"))
        process = start_glewlwyd(folder)
        set_up()
        server = make_server("127.0.0.1", 0, app, server_class=ThreadingServer, handler_class=KeepAliveHandler)
        print(f"PORT {server.server_port}", flush=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started = time.monotonic()
        while time.monotonic() - started < HARD_TIMEOUT:
            readable, _, _ = select.select([sys.stdin], [], [], 1.0)
            if readable and not sys.stdin.buffer.read1(4096):
                break
            if process.poll() is not None:
                sys.stderr.write(f"glewlwyd exited with {process.returncode}\n")
                break
    finally:
        if server is not None:
            server.shutdown()
        if process is not None:
            stop(process)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
