#!/usr/bin/env python3
"""A keep-alive HTTP/1.1 server that resets an idle connection at the moment it is reused.

Standard library only. Start it with `python3 reset_server.py [IDLE_SECONDS]` (0.2 by default); it
binds 127.0.0.1 on an ephemeral port, prints `PORT <n>` as its first line of stdout, and serves
until its stdin closes (so it never outlives the test that started it) or HARD_TIMEOUT passes.

Why: a server with a keep-alive timeout (gunicorn: 2 s) closes an idle connection in the same
millisecond a client reuses it. The client has written a request that nobody reads, gets no
answer, and sends it again on a new connection: a client that cannot rewind the body sends the
headers (with their Content-Length) and none of the body, and the server waits for bytes that
never come. This server makes that moment certain: when a request arrives on a connection that
has been idle for IDLE_SECONDS or more, it closes the connection with an RST (SO_LINGER 0) without
answering.

Every request that is read is answered 200 with `{"method", "expected", "received"}`: the body
length the headers announced and the bytes that arrived. A body that does not arrive within
BODY_WAIT seconds is answered with what arrived (so a body-less retry is seen at once, not as a
client timeout) and counted `short`: a server would have taken it as the whole request. A request
whose connection the client closes before the whole body came is dropped unanswered, as real
servers do, and counted `cut`. `GET /_stats` answers `{"resets": n, "requests": n, "short": n,
"cut": n, "connections": n}` (on a fresh connection it is never reset; `connections` counts those
accepted, /_stats's own included).
"""

import json
import socket
import struct
import sys
import threading
import time

HARD_TIMEOUT = 120.0
BODY_WAIT = 1.0

lock = threading.Lock()
stats = {"resets": 0, "requests": 0, "short": 0, "cut": 0, "connections": 0}


def reset(conn):
    """Closes with an RST, as a server that drops an idle connection under a reused one does."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    conn.close()


def read_head(conn, buffer):
    """Reads until the end of the head; returns (head, rest) or (None, buffer) when the peer closed."""
    while b"\r\n\r\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            return None, buffer
        buffer += chunk
    head, rest = buffer.split(b"\r\n\r\n", 1)
    return head, rest


def serve(conn, idle):
    buffer = b""
    last_answer = None  # when the last response went out: the connection is idle since then
    try:
        while True:
            if not buffer:
                # Wait for the next request; a connection idle past `idle` is reset when it comes.
                conn.settimeout(30.0)
                try:
                    first = conn.recv(65536)
                except socket.timeout:
                    conn.close()
                    return
                if not first:
                    conn.close()
                    return
                if last_answer is not None and time.monotonic() - last_answer >= idle:
                    with lock:
                        stats["resets"] += 1
                    reset(conn)
                    return
                buffer = first
            conn.settimeout(BODY_WAIT)
            try:
                head, rest = read_head(conn, buffer)
            except socket.timeout:
                conn.close()
                return
            if head is None:
                conn.close()
                return
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) < 2:
                # Not a request line (the rest of a body the headers did not announce): give up.
                reset(conn)
                return
            method, path = parts[0:2]
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            expected = int(headers.get("content-length", "0") or "0")
            body = rest
            while len(body) < expected:
                try:
                    chunk = conn.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    # The client closed before the whole body came: as real servers do, the
                    # request is dropped unanswered (a client that stopped a try it knew short).
                    with lock:
                        stats["cut"] += 1
                    conn.close()
                    return
                body += chunk
            buffer = body[expected:] if len(body) > expected else b""
            received = min(len(body), expected)
            if path == "/_stats":
                with lock:
                    payload = json.dumps(stats).encode()
            else:
                with lock:
                    stats["requests"] += 1
                    if received < expected:
                        stats["short"] += 1
                payload = json.dumps({"method": method, "expected": expected, "received": received}).encode()
            response = (
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                + b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
            )
            if headers.get("connection", "").lower() == "close":
                # As real servers do: the client asked to close after this answer.
                conn.sendall(response.replace(b"Connection: keep-alive", b"Connection: close"))
                conn.close()
                return
            conn.sendall(response)
            last_answer = time.monotonic()
    except OSError:
        try:
            conn.close()
        except OSError:
            pass


def main():
    idle = float(sys.argv[1]) if len(sys.argv) > 1 else 0.2
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    print("PORT %d" % listener.getsockname()[1], flush=True)

    def accept():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with lock:
                stats["connections"] += 1
            threading.Thread(target=serve, args=(conn, idle), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    # Exit when the test closes stdin, or after HARD_TIMEOUT.
    watcher = threading.Thread(target=lambda: sys.stdin.read(), daemon=True)
    watcher.start()
    watcher.join(HARD_TIMEOUT)


if __name__ == "__main__":
    main()
