"""The HTTP/REST listener on h2corn: inference served natively over ASGI, every other route forwarded.

``streamrt serve --http-server h2corn`` (issue 26). Under perf_analyzer with 64 B requests on the 2-core CPU
machine, aiohttp's own request parsing, routing, middleware and response writing took more of the event loop
than StreamRT's inference handler (73% of the loop in ``RequestHandler._handle_request``, 41% of that in
``InferenceRoutes.infer``: docs/benchmarks/2026-12-07-small-request-cpu.md). h2corn (HTTP/1.1 and cleartext
HTTP/2 parsed in Rust, the application through ASGI, the server gRPC already uses: :mod:`.grpc_h2corn`) runs in
the server's own event loop. Measured there beside a real tritonserver, perf_analyzer at concurrency 16, three
rounds (docs/benchmarks/2026-12-07-http-h2corn-cpu.md): 64 B requests 2,939-3,274 requests/s (0.77-0.87x
Triton) at 311-348 us of server CPU each (Triton 319-330), against aiohttp's 1,934-2,167 (0.49-0.56x) at
459-498 us; 4.8 MB requests (8 x 602 KB) the same requests/s as aiohttp (1.13-1.45x Triton, the model sets it)
but 8,073-8,845 us of server CPU against aiohttp's 6,292-6,739: h2corn hands an HTTP/1.1 body over in 8 KiB
pieces (~590 ASGI events, each waking the loop, for 4.8 MB) where aiohttp's reads are larger.

``POST /v2/models/{m}[/versions/{v}]/infer`` is :func:`~streamrt.serve.listeners.http.answer_infer`, the very
code aiohttp's :class:`~streamrt.serve.listeners.http.InferenceRoutes` runs: auth, the body limit (413),
``Content-Encoding`` gzip/deflate request bodies, ``Inference-Header-Content-Length``, the body read into the
port's buffer (a front-end worker's shared arena), ``{"error": ...}`` with the status table's code, and replies
of :data:`~streamrt.serve.listeners.http.COMPRESS_MIN_BYTES` or more compressed when ``Accept-Encoding`` asks.
Any other path or method (health, metadata, config, statistics, repository, shared memory, the 501
extensions) goes unchanged to the aiohttp app on a private Unix socket (:class:`~.http_forward.HttpForwarder`):
in one process :func:`start_http_h2corn` starts :func:`~streamrt.serve.listeners.http.build_app` there, a
front-end worker forwards to the engine process's own app. Keep-alive and HTTP/1.1 pipelining are h2corn's.
"""

from __future__ import annotations

import json
import logging
import tempfile
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from streamrt.errors import PayloadTooLargeError, RequestError, StreamRTError
from streamrt.serve.listeners.h2corn_server import LARGE_FRAMES, lifespan, serve_asgi
from streamrt.serve.listeners.http import answer_infer, error_reply, fill_body, reply_coding
from streamrt.serve.listeners.http_forward import HttpForwarder
from streamrt.serve.port import InferencePort
from streamrt.serve.wire.protocol import HEADER_LENGTH

if TYPE_CHECKING:
    from streamrt.serve.core import ServerCore

__all__ = ["HttpAsgi", "infer_route", "start_http_h2corn"]

log = logging.getLogger(__name__)

_PREFIX, _SUFFIX = "/v2/models/", "/infer"
_JSON = (b"content-type", b"application/json")
_JSON_ERROR = (b"content-type", b"application/json; charset=utf-8")  # aiohttp's json_response, as errors go there
_BINARY = (b"content-type", b"application/octet-stream")
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def infer_route(method: str, path: str) -> tuple[str, str] | None:
    """(model, version) of ``POST /v2/models/{m}[/versions/{v}]/infer`` ("" for no version), else None."""
    if method != "POST" or not path.startswith(_PREFIX) or not path.endswith(_SUFFIX):
        return None
    parts = path[len(_PREFIX) : -len(_SUFFIX)].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], ""
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


class _Disconnected(Exception):
    """The client went away before its request's body ended."""


class _Body:
    """One request's body from ASGI ``receive``."""

    def __init__(self, receive: Callable[[], Awaitable[dict[str, Any]]], length: int | None, limit: int,
                 encoding: str) -> None:
        self._receive, self._length, self._limit, self._encoding = receive, length, limit, encoding
        self._more = True

    async def chunk(self) -> bytes:
        """The next piece of the body; b"" at its end."""
        if not self._more:
            return b""
        event = await self._receive()
        if event["type"] == "http.disconnect":
            raise _Disconnected
        self._more = bool(event.get("more_body", False))
        return event.get("body", b"")

    async def read(self, into: np.ndarray | None, identity: bool) -> bytes | memoryview:
        """:data:`~streamrt.serve.listeners.http.BodyReader`: into ``into`` when the length is known."""
        if identity and self._length is not None:
            return await fill_body(self.chunk, self._length, into)
        pieces, size = [], 0
        while chunk := await self.chunk():
            pieces.append(chunk)
            size += len(chunk)
            if size > self._limit:
                raise PayloadTooLargeError(f"request body exceeds the server limit of {self._limit} bytes")
        body = b"".join(pieces)
        return body if identity else self._inflate(body)

    def _inflate(self, body: bytes) -> bytes:
        """A gzip or deflate body decoded, as aiohttp does (deflate: zlib-wrapped, or raw as some clients send)."""
        for wbits in (_WBITS[self._encoding], -zlib.MAX_WBITS):
            try:
                inflater = zlib.decompressobj(wbits)
                data = inflater.decompress(body, self._limit + 1)
            except zlib.error as exc:
                if self._encoding == "deflate" and wbits > 0:
                    continue
                raise RequestError(f"cannot decode the {self._encoding} request body: {exc}") from None
            if len(data) > self._limit:
                raise PayloadTooLargeError(f"request body exceeds the server limit of {self._limit} bytes")
            return data
        raise AssertionError("unreachable")  # pragma: no cover


class HttpAsgi:
    """The ASGI application: inference over ``port``, everything else through ``forwarder``."""

    def __init__(self, port: InferencePort, forwarder: HttpForwarder) -> None:
        self.port, self.forwarder = port, forwarder
        self.limit = port.config.max_request_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
            return
        method, path = scope["method"], scope["path"]
        route = infer_route(method, path)
        try:
            if route is None:
                await self._forward(scope, receive, send)
            else:
                await self._infer(scope, route, receive, send)
        except _Disconnected:
            return

    async def _infer(self, scope: dict[str, Any], route: tuple[str, str], receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            self.port.check_auth(headers.get("authorization"))
            length = _content_length(headers.get("content-length"))
            encoding = headers.get("content-encoding", "identity")
            body = _Body(receive, length, self.limit, encoding.lower())
            payload, json_length = await answer_infer(
                self.port, *route, body.read, length=length, encoding=encoding,
                header_length=headers.get(HEADER_LENGTH.lower()), trace_parent=headers.get("traceparent"))
        except StreamRTError as exc:
            await _refuse(send, scope, exc)
            return
        if json_length is None:
            reply_headers = [_JSON]
        else:
            reply_headers = [_BINARY, (HEADER_LENGTH.lower().encode(), str(json_length).encode())]
        coding = reply_coding(len(payload), headers.get("accept-encoding", ""))
        if coding is not None:
            compressor = zlib.compressobj(wbits=_WBITS[coding])
            payload = compressor.compress(payload) + compressor.flush()
            reply_headers.append((b"content-encoding", coding.encode()))
        await _reply(send, 200, reply_headers, payload)

    async def _forward(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # the aiohttp app behind has the same limit (client_max_size): a body over it is refused here, before it
        # is held whole in memory to be sent on
        body = _Body(receive, None, self.limit, "identity")
        try:
            data = await body.read(None, True)  # still encoded: its Content-Encoding travels with it
        except StreamRTError as exc:
            await _refuse(send, scope, exc)
            return
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        status, kept, answer = await self.forwarder.forward(scope["method"], target.decode("latin-1"), headers,
                                                            bytes(data))
        await _reply(send, status, [(k.lower().encode(), v.encode("latin-1")) for k, v in kept.items()], answer)


def _content_length(raw: str | None) -> int | None:
    try:
        return None if raw is None else int(raw)
    except ValueError:
        raise RequestError(f"Content-Length must be an integer, got {raw!r}") from None


async def _refuse(send: Any, scope: dict[str, Any], exc: StreamRTError) -> None:
    """The ``{"error": ...}`` answer of a failed request, with the status table's code."""
    status, message = error_reply(exc, scope["method"], scope["path"])
    await _reply(send, status, [_JSON_ERROR], json.dumps({"error": message}).encode())


async def _reply(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def start_http_h2corn(port: InferencePort, host: str, tcp_port: int, *, forward_to: str | None = None,
                            server: ServerCore | None = None, reuse_port: bool = False, threads: int = 0,
                            ) -> tuple[Callable[[], Awaitable[None]], int]:
    """Serve HTTP on ``host:tcp_port`` with h2corn in this event loop; (stop, the bound port).

    The other routes go to the aiohttp app on the Unix socket ``forward_to`` (a front-end worker: the engine
    process's), or, given ``server`` instead, to ``build_app(server)`` started here on a socket of a temporary
    folder. ``reuse_port``: front-end worker processes share the port; ``threads``: h2corn's Tokio threads."""
    closers: list[Callable[[], Awaitable[Any]]] = []
    if forward_to is None:
        assert server is not None, "start_http_h2corn needs forward_to or server"
        forward_to = await _serve_aiohttp_privately(server, closers)
    forwarder = HttpForwarder(forward_to)
    try:
        stop_h2corn, bound = await serve_asgi(
            HttpAsgi(port, forwarder), host, tcp_port, what="HTTP", port_flag="--http-port", reuse_port=reuse_port,
            threads=threads, http1=True, grpc=False, max_request_body_size=0,  # 0: no limit of h2corn's, ours
            **LARGE_FRAMES)  # for HTTP/2 cleartext clients; HTTP/1.1 bodies come in 8 KiB pieces whatever is set
    except BaseException:
        for close in reversed(closers):
            await close()
        raise

    async def stop() -> None:
        await stop_h2corn()
        await forwarder.close()
        for close in reversed(closers):
            await close()

    return stop, bound


async def _serve_aiohttp_privately(server: ServerCore, closers: list[Callable[[], Awaitable[Any]]]) -> str:
    """``build_app(server)`` on a Unix socket in a new temporary folder (removed at stop); the socket's path."""
    from aiohttp import web

    from streamrt.serve.listeners.http import build_app

    folder = tempfile.TemporaryDirectory(prefix="streamrt-http-")
    path = str(Path(folder.name) / "http.sock")
    runner = web.AppRunner(build_app(server), access_log=None, handle_signals=False)
    await runner.setup()

    async def clean_folder() -> None:
        folder.cleanup()

    closers.append(clean_folder)
    closers.append(runner.cleanup)
    await web.UnixSite(runner, path).start()
    return path
