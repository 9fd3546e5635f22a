#!/usr/bin/env python3
"""An OAuth 2.0 authorization server that is django-oauth-toolkit itself, plus an API.

Needs Django and django-oauth-toolkit (`.ci/run` installs them into `.build/authlib-venv`, the
venv of the test servers). Start it with `python dot_server.py [EXPIRES_IN]`: it binds 127.0.0.1
on an ephemeral port, prints `PORT <n>` first, and serves until its stdin closes or HARD_TIMEOUT
passes. Its database is a SQLite file in a temporary folder, removed at exit. The full form is
`python dot_server.py [EXPIRES_IN] [IDLE_RESET] [REUSE_PROTECTION]`.

- Token endpoint `POST /o/token/`: django-oauth-toolkit's own (oauthlib underneath), with its
  defaults but the access token's lifetime: EXPIRES_IN seconds (1 by default); refresh tokens
  rotate (a new one each time, the one presented revoked). REUSE_PROTECTION 1 turns on the
  toolkit's `REFRESH_TOKEN_REUSE_PROTECTION`: a spent refresh token presented again revokes its
  whole family, as a server that suspects theft does (the client's session is then over). Applications, each with a hashed
  secret as the toolkit stores them: `basic` (secret `basic-secret`), `post` (`post-secret`),
  `spaced` (`secret with space`; the toolkit reads a Basic secret with `unquote_plus`, so a form-
  encoded one works, where Authlib's `unquote` fails it), all with the password grant (and so
  the refresh grant), and `service` (`service-secret`, client credentials). User `alice`,
  password `wonderland`.
- `GET /api/me`: 200 `{"status":0}` for a live access token (the toolkit's `verify_request`), 401
  with `WWW-Authenticate: Bearer error="invalid_token"` otherwise, as Django REST framework's
  `OAuth2Authentication` answers.
- HTTP/1.1 keep-alive (`keepalive.py`, shared with authlib_server.py). Requests run one at a
  time: SQLite takes one writer, and what is tested is the client. A connection idle for
  IDLE_RESET seconds (0, the default: never) is reset with an RST when the next request arrives
  on it, unanswered (a keep-alive timeout meeting the client's reuse, made certain).
- `GET /_stats`: token calls, tokens issued, refresh tokens presented more than once
  (`refresh_reused`: a spent token presented again, whatever the server answered), token calls
  by grant, token answers by status, API answers by status, idle resets (and those of them that
  met a token call), requests dropped because the client closed before their whole body came.
"""

import io
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.parse
from wsgiref.simple_server import make_server

import django
from django.conf import settings

from keepalive import ThreadingServer, resetting_handler

HARD_TIMEOUT = 300.0
EXPIRES_IN = int(sys.argv[1]) if len(sys.argv) > 1 else 1
IDLE_RESET = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
REUSE_PROTECTION = len(sys.argv) > 3 and sys.argv[3] == "1"

folder = tempfile.mkdtemp(prefix="dot-server-")
settings.configure(
    DEBUG=False,
    SECRET_KEY="dot-server-test-only",
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "oauth2_provider"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(folder, "db.sqlite3"),
            "OPTIONS": {"timeout": 30},
        }
    },
    DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    ROOT_URLCONF=__name__,
    MIDDLEWARE=[],
    USE_TZ=True,
    # The toolkit hashes client secrets with Django's password hashers; PBKDF2's million rounds
    # would make each token call take a quarter of a second. The same code path, a fast hash.
    PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
    LOGGING_CONFIG=None,
    OAUTH2_PROVIDER={
        "ACCESS_TOKEN_EXPIRE_SECONDS": EXPIRES_IN,
        "ROTATE_REFRESH_TOKEN": True,
        "REFRESH_TOKEN_REUSE_PROTECTION": REUSE_PROTECTION,
    },
)
django.setup()

from django.contrib.auth import get_user_model  # noqa: E402 (after setup)
from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.http import JsonResponse  # noqa: E402
from django.urls import include, path  # noqa: E402
from oauth2_provider.models import get_application_model  # noqa: E402
from oauth2_provider.oauth2_backends import get_oauthlib_core  # noqa: E402

lock = threading.Lock()
stats = {
    "token_calls": 0,
    "issued": 0,
    "refresh_reused": 0,
    "grants": {},
    "token_answers": {},
    "api": {},
    "resets": 0,
    "token_resets": 0,
    "cut": 0,
}
presented = set()


def me(request):
    valid, _ = get_oauthlib_core().verify_request(request, scopes=[])
    if valid:
        return JsonResponse({"status": 0})
    response = JsonResponse({"detail": "Authentication credentials were not provided or are invalid."}, status=401)
    response["WWW-Authenticate"] = 'Bearer realm="api", error="invalid_token"'
    return response


urlpatterns = [
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
    path("api/me", me),
]


def set_up():
    call_command("migrate", verbosity=0, interactive=False)
    get_user_model().objects.create_user("alice", password="wonderland")
    application = get_application_model()
    for client_id, secret, grant in [
        ("basic", "basic-secret", application.GRANT_PASSWORD),
        ("post", "post-secret", application.GRANT_PASSWORD),
        ("spaced", "secret with space", application.GRANT_PASSWORD),
        ("service", "service-secret", application.GRANT_CLIENT_CREDENTIALS),
    ]:
        application.objects.create(
            name=client_id,
            client_id=client_id,
            client_secret=secret,
            client_type=application.CLIENT_CONFIDENTIAL,
            authorization_grant_type=grant,
        )


django_app = WSGIHandler()


def app(environ, start_response):
    """Django's app, one request at a time, counted; the answer sent with its Content-Length."""
    method = environ["REQUEST_METHOD"]
    where = environ.get("PATH_INFO", "")
    if where == "/_stats":
        with lock:
            body = json.dumps(stats).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]
    length = int(environ.get("CONTENT_LENGTH") or 0)
    data = environ["wsgi.input"].read(length) if length > 0 else b""
    environ["wsgi.input"] = io.BytesIO(data)
    token_call = method == "POST" and where == "/o/token/"
    answer = {}

    def keep(status, headers, exc_info=None):
        answer["status"], answer["headers"] = status, headers

    with lock:
        if token_call:
            stats["token_calls"] += 1
            form = urllib.parse.parse_qs(data.decode("utf-8", "replace"))
            grant = (form.get("grant_type") or ["?"])[0]
            stats["grants"][grant] = stats["grants"].get(grant, 0) + 1
            for token in form.get("refresh_token", []):
                if token in presented:
                    stats["refresh_reused"] += 1
                presented.add(token)
        result = django_app(environ, keep)
        try:
            body = b"".join(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        code = answer["status"].split(" ", 1)[0]
        if token_call:
            stats["token_answers"][code] = stats["token_answers"].get(code, 0) + 1
            if code == "200" and b"access_token" in body:
                stats["issued"] += 1
        elif where.startswith("/api/"):
            stats["api"][code] = stats["api"].get(code, 0) + 1
    headers = [(k, v) for k, v in answer["headers"] if k.lower() != "content-length"]
    start_response(answer["status"], headers + [("Content-Length", str(len(body)))])
    return [body]


KeepAliveHandler = resetting_handler(IDLE_RESET, lock, stats, b"POST /o/token/")


def main():
    # The test closes stdin and then terminates: either way the folder goes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    set_up()
    server = make_server("127.0.0.1", 0, app, server_class=ThreadingServer, handler_class=KeepAliveHandler)
    print(f"PORT {server.server_port}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < HARD_TIMEOUT:
            readable, _, _ = select.select([sys.stdin], [], [], 1.0)
            if readable and not sys.stdin.buffer.read1(4096):
                break
    finally:
        server.shutdown()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
