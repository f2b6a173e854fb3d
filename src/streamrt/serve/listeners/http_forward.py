"""HTTP requests forwarded unchanged to an aiohttp app on a private Unix socket, and its answers back.

A front-end worker forwards every route but inference to the engine process's own HTTP app (the
control socket); the h2corn HTTP listener (:mod:`.http_h2corn`) forwards every route but inference to
the aiohttp app of :func:`~streamrt.serve.listeners.http.build_app` (one process) or to the engine
process (a worker). Either way the other routes answer exactly what the aiohttp server answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streamrt.serve.wire.protocol import HEADER_LENGTH

__all__ = ["HttpForwarder"]

# Headers of one hop: the connection to this server, not the request (the body is sent whole, with its length).
_HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})
_KEPT_REPLY_HEADERS = frozenset({"content-type", "content-encoding", HEADER_LENGTH.lower()})


class HttpForwarder:
    """Sends requests to the aiohttp app on ``socket_path`` (one client session, opened on first use)
    and returns its answers. Called with an aiohttp request it is an aiohttp handler."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.session: Any = None

    async def forward(self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes,
                      ) -> tuple[int, dict[str, str], bytes]:
        """(status, the reply's content headers, its body as sent, compressed or not) of ``method target``
        (path and query); the engine gone is 503 ``{"error": ...}``. ``headers``: the request's, with
        ``Content-Encoding`` only if ``body`` is still encoded."""
        from aiohttp import ClientSession, ClientTimeout, UnixConnector

        if self.session is None:
            # no timeout of our own: a load request may build an engine for minutes, as in one process
            self.session = ClientSession(connector=UnixConnector(path=self.socket_path), auto_decompress=False,
                                         timeout=ClientTimeout(total=None))
        sent = {k: v for k, v in headers if k.lower() not in _HOP_HEADERS}
        try:
            async with self.session.request(method, f"http://engine{target}", headers=sent, data=body or None,
                                            allow_redirects=False) as answer:
                data = await answer.read()
                kept = {k: v for k, v in answer.headers.items() if k.lower() in _KEPT_REPLY_HEADERS}
                return answer.status, kept, data
        except OSError:
            return 503, {"Content-Type": "application/json"}, b'{"error": "the engine process is not answering; retry"}'

    async def __call__(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read()  # decoded by aiohttp: its Content-Encoding stays here
        headers = [(k, v) for k, v in request.headers.items() if k.lower() != "content-encoding"]
        status, kept, data = await self.forward(request.method, str(request.rel_url), headers, body)
        return web.Response(status=status, body=data, headers=kept)

    async def close(self, app: Any = None) -> None:
        if self.session is not None:
            await self.session.close()
