"""A real local HTTP video stream for the camera tests: an MPEG-TS clip served over a socket.

The body is close-delimited (no Content-Length), as a live HTTP camera sends it; ``rate`` bytes
per second throttle it like a live encoder (None: as fast as the socket takes it). ``kill()``
cuts every open connection mid-stream and stops listening, ``start()`` listens again on the
same port: a camera server that dies and comes back.
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ClipServer:
    def __init__(self, data: bytes, *, rate: float | None = None, port: int = 0) -> None:
        self.data = data
        self.rate = rate
        self.port = port or _free_port()
        self.connections = 0
        self._server: ThreadingHTTPServer | None = None
        self._dead = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/live.ts"

    def start(self) -> ClipServer:
        owner = self
        self._dead = dead = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:
                owner.connections += 1
                self.send_response(200)
                self.send_header("Content-Type", "video/mp2t")
                self.end_headers()
                chunk = 188 * 20
                started = time.perf_counter()
                for offset in range(0, len(owner.data), chunk):
                    if dead.is_set():
                        return
                    if owner.rate:
                        delay = started + offset / owner.rate - time.perf_counter()
                        if delay > 0:
                            time.sleep(delay)
                    try:
                        self.wfile.write(owner.data[offset: offset + chunk])
                    except OSError:
                        return

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def kill(self) -> None:
        self._dead.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ClipServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
