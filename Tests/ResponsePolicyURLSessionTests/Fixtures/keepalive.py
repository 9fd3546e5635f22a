"""The keep-alive HTTP/1.1 server the authorization-server fixtures share (authlib_server.py,
dot_server.py): wsgiref, one thread per connection, and a connection idle for a while reset when
it is reused.

wsgiref, not werkzeug's server: werkzeug answers every request with `Connection: close` and,
after each response, reads what the socket holds for 10 ms, which swallows a kept-alive
connection's next request. With it every request took a connection of its own, the idle reset
never happened, and a run left ~9,000 client sockets in TIME_WAIT, which made connect() on the
machine crawl for the next 60 s.

Standard library only; a fixture imports it from its own folder (Python puts a script's folder
first on its path).
"""

import io
import select
import socket
import struct
import time
from socketserver import ThreadingMixIn
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer


class KeepAliveServerHandler(ServerHandler):
    """wsgiref's response writer, answering in HTTP/1.1 (it says 1.0, which ends the connection)."""

    http_version = "1.1"


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


def resetting_handler(idle_reset, lock, stats, token_request_prefix):
    """A request handler class: HTTP/1.1 keep-alive; a connection idle for `idle_reset` seconds
    (0: never) is reset with an RST, unanswered, when the next request arrives on it (a keep-alive
    timeout meeting the client's reuse, made certain).

    Counts under `lock` in `stats`: `resets`, `token_resets` (a reset request line starting with
    `token_request_prefix`, bytes) and `cut` (a request whose client closed before its whole body
    came, dropped unanswered as real servers do).
    """

    class ResettingHandler(WSGIRequestHandler):
        protocol_version = "HTTP/1.1"
        # wsgiref writes the head and the body apart: with Nagle's algorithm a kept-alive
        # connection waits for the client's delayed ACK (40 ms) between them.
        disable_nagle_algorithm = True

        def log_message(self, *args):
            pass

        def handle_one_request(self):
            self.raw_requestline = self.rfile.readline(65537)
            if not self.raw_requestline or len(self.raw_requestline) > 65536:
                self.close_connection = True
                return
            if not self.parse_request():
                self.close_connection = True
                return
            body = self.rfile
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                # Not sent by the clients here; served, then the connection ends (nothing to
                # drain by).
                self.close_connection = True
            else:
                # The whole body is read before the app runs: an answer that never reads it (a
                # transient 503 to a token call) must not leave it before the next request line.
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length > 0 else b""
                if len(data) < length:
                    with lock:
                        stats["cut"] += 1
                    self.close_connection = True
                    return
                body = io.BytesIO(data)
            handler = KeepAliveServerHandler(body, self.wfile, self.get_stderr(), self.get_environ(), multithread=True)
            handler.request_handler = self
            handler.run(self.server.get_app())
            self.wfile.flush()

        def handle(self):
            self.close_connection = False
            self.handle_one_request()
            while not self.close_connection:
                done = time.monotonic()
                # Clients here send a request once the previous answer is in (no pipelining), so
                # rfile's buffer is empty and the socket says when the next one comes.
                try:
                    readable, _, _ = select.select([self.connection], [], [], 30)
                except (OSError, ValueError):
                    return
                if not readable:
                    return
                if idle_reset > 0 and time.monotonic() - done >= idle_reset:
                    try:
                        first = self.connection.recv(32, socket.MSG_PEEK)
                    except OSError:
                        first = b""
                    if first:
                        with lock:
                            stats["resets"] += 1
                            if first.startswith(token_request_prefix):
                                stats["token_resets"] += 1
                        try:
                            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        except OSError:
                            pass
                    self.close_connection = True
                    return
                self.handle_one_request()

    return ResettingHandler
