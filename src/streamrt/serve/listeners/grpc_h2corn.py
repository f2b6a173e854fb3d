"""The gRPC listener on h2corn: the same RPC handlers as the grpcio listener, served by a Rust HTTP/2 server.

``streamrt serve --grpc-server h2corn`` (issue 26). grpcio's asyncio server spends 163-191 us of server CPU
per request before any handler runs, as much as a real tritonserver's whole request (154-174 us) on the
2-core CPU machine; gRPC over h2corn (HTTP/2 in Rust, the application through ASGI) costs 38-47 us
(docs/benchmarks/2026-12-04-grpc-floor-cpu.md). This module runs grpcio's method handlers (what
:meth:`~streamrt.serve.listeners.grpc_service.InferenceRpcs.handler` builds: every RPC of the KServe v2 /
Triton service, ``ModelStreamInfer`` included) as an ASGI application embedded in the server's own event
loop (``h2corn.Server``), so the listeners, the scheduler and the handlers stay one loop as with grpcio.

The gRPC wire over ASGI, as the handlers expect it from grpcio:

* requests: 5-byte frames (flag, big-endian length); a compressed frame (flag 1) is decompressed by its
  ``grpc-encoding`` (gzip or deflate, as grpcio's server accepts; another is UNIMPLEMENTED); a message over
  the server's limit (compressed or not) is refused RESOURCE_EXHAUSTED with grpcio's wording; answers go
  back uncompressed (gRPC lets a server answer so whatever the client accepts);
* the handler's ``context``: ``invocation_metadata()`` (the request headers, pseudo-headers left out),
  ``abort(code, details)``, ``time_remaining()`` (from ``grpc-timeout``);
* answers: ``grpc-status`` / ``grpc-message`` (percent-encoded) in the HTTP/2 trailers, or in the headers
  alone (Trailers-Only) when the call fails before its first message; a handler's unexpected exception is
  UNKNOWN "Unexpected <class>: <message>", logged with its traceback, as grpcio does.

h2corn is optional (the ``fast-grpc`` extra); asking for it without it installed is a one-line error with
the pip command. With ``--frontend-processes N`` every front-end worker serves gRPC on h2corn the same way
(the port shared with SO_REUSEPORT, inference over its engine link, the other RPCs forwarded).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NoReturn

from streamrt.serve.listeners.h2corn_server import (
    LARGE_FRAMES,
    SMALL_MACHINE_CPUS,
    default_threads,
    lifespan,
    serve_asgi,
)

__all__ = ["SMALL_MACHINE_CPUS", "GrpcAsgi", "default_threads", "start_grpc_h2corn"]

log = logging.getLogger(__name__)

_START = {"type": "http.response.start", "status": 200, "trailers": True,
          "headers": [(b"content-type", b"application/grpc")]}
_END_OF_BODY = {"type": "http.response.body", "body": b"", "more_body": False}
_OK = [(b"grpc-status", b"0")]
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
# gRPC's percent-encoding of grpc-message: printable ASCII except '%' stays as it is.
_PLAIN = frozenset(range(0x20, 0x7F)) - {ord("%")}


def frame(message: bytes) -> bytes:
    """One uncompressed gRPC message: flag 0, big-endian length, the bytes."""
    return b"\0" + len(message).to_bytes(4, "big") + message


def percent_encode(text: str) -> bytes:
    """``grpc-message``'s encoding: UTF-8, every byte outside printable ASCII (and '%') as %XX."""
    return b"".join(bytes([b]) if b in _PLAIN else b"%%%02X" % b for b in text.encode())


class _Abort(Exception):
    """What :meth:`_Context.abort` raises to end the handler (grpcio's ``AbortError``)."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _Status(Exception):
    """A call refused by the listener itself (bad framing, size), before or between the handler's messages."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


def _code_number(code: Any) -> int:
    """grpc's ``StatusCode`` member (``value`` is ``(number, name)``) or a plain number."""
    value = getattr(code, "value", code)
    return int(value[0] if isinstance(value, tuple) else value)


class _Context:
    """The part of grpc.aio's ``ServicerContext`` that StreamRT's handlers use."""

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self._headers, self._started = headers, time.monotonic()
        self._metadata: tuple[tuple[str, str], ...] | None = None  # decoded when a handler asks

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        if self._metadata is None:
            self._metadata = tuple([(k.decode("latin-1"), v.decode("latin-1"))
                                    for k, v in self._headers if k[:1] != b":"])
        return self._metadata

    def time_remaining(self) -> float | None:
        timeout = next((v for k, v in self.invocation_metadata() if k == "grpc-timeout"), None)
        return None if timeout is None else max(0.0, self._started + _timeout_s(timeout) - time.monotonic())

    async def abort(self, code: Any, details: str = "") -> NoReturn:
        raise _Abort(_code_number(code), details)


def _timeout_s(value: str) -> float:
    """``grpc-timeout`` ("100m", "5S") in seconds; a malformed one is no deadline."""
    try:
        return int(value[:-1]) * _TIMEOUT_UNITS[value[-1]]
    except (ValueError, KeyError, IndexError):
        return float("inf")


class _Frames:
    """The request's gRPC messages as they arrive over ASGI ``receive``.

    A message that lies inside one body chunk (h2corn hands over large DATA frames whole) is a view of that
    chunk: no copy; one spread over chunks is gathered into memory of its own size (one copy)."""

    def __init__(self, receive: Callable[[], Awaitable[dict[str, Any]]], limit: int, encoding: str) -> None:
        self._receive, self._limit, self._encoding = receive, limit, encoding
        self._pending = memoryview(b"")  # what the last chunk holds beyond the bytes taken so far
        self._more = True

    def _decompress(self, data: memoryview | bytes) -> bytes:
        wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(self._encoding)
        if wbits is None:
            raise _Status(12, f"Compression algorithm '{self._encoding}' is not supported (gzip, deflate or identity)")
        inflater = zlib.decompressobj(wbits)
        try:
            message = inflater.decompress(data, self._limit + 1)
        except zlib.error as exc:
            raise _Status(13, f"Failed to decompress the {self._encoding} message: {exc}") from None
        if len(message) > self._limit:
            raise _Status(8, f"Received message larger than max (more than {self._limit} bytes after "
                             f"{self._encoding} decompression vs. {self._limit})")
        return message

    async def next(self) -> memoryview | bytes | None:
        """The next message, or None at the end of the request."""
        header = await self._take(5)
        if header is None:
            return None
        flag, size = header[0], int.from_bytes(header[1:5], "big")
        if size > self._limit:
            raise _Status(8, f"Received message larger than max ({size} vs. {self._limit})")
        message = await self._take(size)
        if message is None:
            raise _Status(13, "the request ended inside a gRPC message")
        return self._decompress(message) if flag else message

    async def _take(self, n: int) -> memoryview | bytes | None:
        """The next ``n`` bytes of the body (None at its clean end, before any of them)."""
        while not self._pending and self._more:
            self._pending = memoryview(await self._chunk())
        if len(self._pending) >= n:
            taken, self._pending = self._pending[:n], self._pending[n:]
            return taken
        if not self._pending and not self._more:
            return None
        # the pieces joined once: bytes.join copies without zero-filling first, 0.15 ms for 4.8 MB in two chunks
        # against 0.47 ms for a bytearray filled slice by slice (CI machine)
        pieces, have = [], 0
        while have < n:
            if not self._pending:
                if not self._more:
                    raise _Status(13, "the request ended inside a gRPC message")
                self._pending = memoryview(await self._chunk())
                continue
            take = min(n - have, len(self._pending))
            pieces.append(self._pending[:take])
            self._pending, have = self._pending[take:], have + take
        return b"".join(pieces)

    async def _chunk(self) -> bytes:
        event = await self._receive()
        if event["type"] == "http.disconnect":
            raise asyncio.CancelledError("client disconnected")
        self._more = bool(event.get("more_body", False))
        return event.get("body", b"")

    async def only(self) -> memoryview | bytes:
        """The request's one message (a unary call's), or _Status INTERNAL when there is not exactly one.

        The usual case, the whole request in one body event holding exactly one uncompressed
        message, is a view of that body without the general path's steps."""
        if not self._pending and self._more:
            body = await self._chunk()
            if (not self._more and len(body) >= 5 and body[0] == 0
                    and int.from_bytes(body[1:5], "big") == len(body) - 5 and len(body) - 5 <= self._limit):
                return memoryview(body)[5:]
            self._pending = memoryview(body)
        request = await self.next()
        if request is None or await self.next() is not None:
            raise _Status(13, "a unary call needs exactly one request message")
        return request

    async def messages(self) -> AsyncIterator[memoryview | bytes]:
        while (message := await self.next()) is not None:
            yield message


class GrpcAsgi:
    """An ASGI application serving grpcio method handlers (``name -> RpcMethodHandler``) of one service."""

    def __init__(self, handlers: Mapping[str, Any], service: str, max_receive_bytes: int) -> None:
        self.limit = max_receive_bytes
        self._routes = {f"/{service}/{name}": (name, handler) for name, handler in handlers.items()}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        route = self._routes.get(scope.get("path", ""))
        if route is None:
            service, _, method = str(scope.get("path", "")).lstrip("/").partition("/")
            await _trailers_only(send, 12, f"Method not found: {service}/{method}")
            return
        method, handler = route
        headers = scope.get("headers", [])
        encoding = "identity"
        for key, value in headers:
            if key == b"grpc-encoding":
                encoding = value.decode("latin-1").strip().lower()
                break
        context, frames = _Context(headers), _Frames(receive, self.limit, encoding)
        started = False
        try:
            if handler.unary_unary is not None:
                reply = await handler.unary_unary(_decode(handler, await frames.only()), context)
                await send(_START)
                started = True
                # the one message ends the body; the trailers follow (one ASGI send fewer than a stream's end)
                await send({"type": "http.response.body", "body": frame(_encode(handler, reply)), "more_body": False})
                await send({"type": "http.response.trailers", "headers": _OK, "more_trailers": False})
                return
            elif handler.stream_stream is not None:
                requests = (_decode(handler, m) async for m in frames.messages())
                async for reply in handler.stream_stream(requests, context):
                    if not started:
                        await send(_START)
                        started = True
                    await send({"type": "http.response.body", "body": frame(_encode(handler, reply)),
                                "more_body": True})
            else:
                raise _Status(12, f"{method}: only unary and bidirectional-streaming RPCs are served here")
            code, details = 0, ""
        except (_Abort, _Status) as exc:
            code, details = exc.code, exc.details
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # grpcio's answer to a handler's bug: UNKNOWN, traceback in the log
            log.exception("gRPC %s failed", method)
            code, details = 2, f"Unexpected {type(exc)}: {exc}"
        if not started:
            await _trailers_only(send, code, details)
            return
        await send(_END_OF_BODY)  # ASGI: the body ends before the trailers begin
        await send({"type": "http.response.trailers", "headers": _status(code, details), "more_trailers": False})


def _decode(handler: Any, message: memoryview | bytes) -> Any:
    return handler.request_deserializer(message) if handler.request_deserializer else message


def _encode(handler: Any, reply: Any) -> bytes:
    return handler.response_serializer(reply) if handler.response_serializer else reply


def _status(code: int, details: str) -> list[tuple[bytes, bytes]]:
    headers = [(b"grpc-status", str(code).encode())]
    if details:
        headers.append((b"grpc-message", percent_encode(details)))
    return headers


async def _trailers_only(send: Any, code: int, details: str) -> None:
    """A call answered by its status alone (gRPC's Trailers-Only response: headers, no body)."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/grpc"), *_status(code, details)]})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def start_grpc_h2corn(handlers: Mapping[str, Any], service: str, host: str, port: int,
                            max_receive_bytes: int, *, reuse_port: bool = False, threads: int = 0,
                            ) -> tuple[Callable[[], Awaitable[None]], int]:
    """Serve ``handlers`` on ``host:port`` with h2corn in this event loop; (stop, the bound port).
    ``reuse_port``: front-end worker processes share the port (SO_REUSEPORT); ``threads``: Tokio threads
    (0: :func:`~.h2corn_server.default_threads`)."""
    return await serve_asgi(GrpcAsgi(handlers, service, max_receive_bytes), host, port, what="gRPC",
                            port_flag="--grpc-port", reuse_port=reuse_port, threads=threads, grpc=True, http1=False,
                            **LARGE_FRAMES)
