"""gRPC served by HTTP/2 servers whose protocol work is not in Python (Rust, C++), through their ASGI
interface: the ``grpc_library_floor.py`` variants that are not grpcio.

``app`` is a hand-written ASGI gRPC unary handler (no gRPC framework): it reads the request body and
checks its 5-byte length prefix (the message itself is not parsed, as in the grpcio variants), answers
the same fixed, pre-serialized KServe replies as the grpcio variants (``ModelInfer``, ``ModelMetadata``,
``ModelStatistics``) length-prefixed, and ends with ``grpc-status: 0`` in the HTTP/2 trailers (ASGI
extension ``http.response.trailers``). An unknown method gets ``grpc-status: 12`` (UNIMPLEMENTED,
Trailers-Only). So what a request costs is the server's HTTP/2 work plus one ASGI call of a few
awaits: the floor of gRPC over that server. ``connect_app`` is the same service as connectrpc's ASGI
application (its gRPC protocol; a codec passing bytes through, so no protobuf either).

Servers (each its own process, plaintext HTTP/2 with prior knowledge, one worker process), and the
thread settings measured (``SERVERS``):

* ``h2corn`` 2.0 (Rust HTTP/2, ASGI; ``--grpc`` admits ``application/grpc``): Tokio runtime threads 2
  (its default) and 1 (``h2corn-1t``); one Python event loop (uvloop, as installed here);
* ``pyvoy`` 1.3 (Envoy 1.39, C++, the app in Envoy's dynamic module): Envoy worker threads = CPU cores
  (Envoy's default, 2 here) and 1 (``pyvoy-1t``, Envoy ``--concurrency 1``); one Python event-loop
  thread in both (pyvoy's ASGI default ``--worker-threads 1``);
* ``h2corn-connect``: ``connect_app`` on h2corn's defaults. Not on pyvoy: with connectrpc 0.13 and
  pyvoy 1.3 each request logs ``InvalidStateError`` from pyvoy's ``RecvFutureExecutor`` (connectrpc's
  disconnect watch cancels a pending ``receive()`` that pyvoy then completes); the replies are right
  but the run would measure the logging;
* ``granian`` (Rust, hyper) cannot serve gRPC and is not a variant. Its ASGI server does not offer the
  ``http.response.trailers`` extension: granian 2.8.9 lists only ``http.response.pathsend`` and
  ``websocket.http.response`` in the scope, and sending ``http.response.trailers`` raises
  ``RuntimeError('Unsupported ASGI message')`` (a grpcio client then fails with "Stream removed (Data
  frame with END_STREAM flag received)"); RSGI's response methods (``response_bytes``,
  ``response_stream``) take no trailers either. The PR that added the extension
  (emmett-framework/granian#669) was closed unmerged.

None of these packages is a StreamRT dependency: a variant whose package is missing is skipped with
the pip command (``missing``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrt.serve.listeners.grpc_h2corn import frame  # gRPC's 5-byte framing, as StreamRT's listener writes it

HERE = Path(__file__).resolve().parent
MODEL = "null_small"
_served = [0]

_HEADERS = [(b"content-type", b"application/grpc")]
_OK = {"type": "http.response.trailers", "headers": [(b"grpc-status", b"0")]}
_UNIMPLEMENTED = [(b"content-type", b"application/grpc"), (b"grpc-status", b"12"),
                  (b"grpc-message", b"unknown method")]


def replies() -> tuple[bytes, bytes]:
    """The fixed ModelInfer and ModelMetadata replies (KServe v2 protobuf, StreamRT's own descriptors)."""
    from streamrt.serve.wire.proto import messages

    infer = messages.ModelInferResponse(model_name=MODEL, model_version="1")
    infer.outputs.add(name="y", datatype="FP32", shape=[1, 1])
    infer.raw_output_contents.append(b"\0\0\0\0")
    meta = messages.ModelMetadataResponse(name=MODEL, versions=["1"], platform="python")
    meta.inputs.add(name="x", datatype="FP32", shape=[-1, 16])
    meta.outputs.add(name="y", datatype="FP32", shape=[-1, 1])
    return infer.SerializeToString(), meta.SerializeToString()


def stats_reply(count: int) -> bytes:
    """The ModelStatistics reply of a server that has answered ``count`` ModelInfer requests."""
    from streamrt.serve.wire.proto import messages

    reply = messages.ModelStatisticsResponse()
    model = reply.model_stats.add(name=MODEL, version="1", inference_count=count, execution_count=count)
    model.inference_stats.success.count = count
    return reply.SerializeToString()  # type: ignore[no-any-return]


_INFER, _META = (frame(reply) for reply in replies())


def _statistics() -> bytes:
    return frame(stats_reply(_served[0]))


async def app(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
              send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """The ASGI application: gRPC unary calls of the three methods, lifespan answered."""
    if scope["type"] == "lifespan":
        while True:
            event = (await receive())["type"]
            await send({"type": event + ".complete"})
            if event == "lifespan.shutdown":
                return
    message = await receive()
    body = message.get("body", b"")
    while message.get("more_body"):
        message = await receive()
        body += message.get("body", b"")
    if len(body) < 5 or body[0] != 0 or int.from_bytes(body[1:5], "big") != len(body) - 5:
        raise ValueError(f"not one uncompressed gRPC message: {body[:5]!r}, {len(body)} bytes")
    method = scope["path"].rpartition("/")[2]
    if method == "ModelInfer":
        _served[0] += 1
        reply = _INFER
    elif method == "ModelMetadata":
        reply = _META
    elif method == "ModelStatistics":
        reply = _statistics()
    else:  # Trailers-Only: the status in the one HEADERS frame
        await send({"type": "http.response.start", "status": 200, "headers": _UNIMPLEMENTED})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS, "trailers": True})
    await send({"type": "http.response.body", "body": reply})
    await send(_OK)


class _RawCodec:
    """connectrpc's "proto" codec without protobuf: message bytes in and out, as the other variants."""

    def name(self) -> str:
        return "proto"

    def encode(self, message: bytes) -> bytes:
        return message

    def decode(self, data: bytes | bytearray, message_class: type[bytes]) -> bytes:
        return bytes(data)


def _connect_app() -> Any:
    """``app``'s replies through connectrpc's ASGI application (its gRPC protocol, raw codec)."""
    from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
    from connectrpc.server import ConnectASGIApplication, Endpoint

    infer, meta = _INFER[5:], _META[5:]

    async def model_infer(request: bytes, context: Any) -> bytes:
        _served[0] += 1
        return infer

    async def model_metadata(request: bytes, context: Any) -> bytes:
        return meta

    async def model_statistics(request: bytes, context: Any) -> bytes:
        return _statistics()[5:]

    service = "inference.GRPCInferenceService"
    methods = {"ModelInfer": model_infer, "ModelMetadata": model_metadata, "ModelStatistics": model_statistics}

    def endpoints(_: object) -> dict[str, Any]:
        return {f"/{service}/{name}": Endpoint.unary(MethodInfo(
            name=name, service_name=service, input=bytes, output=bytes, idempotency_level=IdempotencyLevel.UNKNOWN,
            stream_type=StreamType.UNARY), fn) for name, fn in methods.items()}

    class Application(ConnectASGIApplication[object]):
        @property
        def path(self) -> str:
            return f"/{service}"

    return Application(service=object(), endpoints=endpoints, codecs=[_RawCodec()], compressions=[])


async def connect_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The connectrpc application, built on first use (so ``app`` alone does not need connectrpc)."""
    if not _connect:
        _connect.append(_connect_app())
    await _connect[0](scope, receive, send)


_connect: list[Any] = []


@dataclass(frozen=True)
class Server:
    """One server variant: the module it needs, the pip name, and its command line."""

    modules: tuple[str, ...]
    command: Callable[[int], list[str]]

    def missing(self) -> str | None:
        """None when the server can run; else why not, with the install command."""
        absent = [m for m in self.modules if importlib.util.find_spec(m) is None]
        if absent:
            return f"{', '.join(absent)} not installed: .venv/bin/pip install {' '.join(absent)}"
        return None


def environment() -> dict[str, str]:
    """The server's environment: this folder on ``PYTHONPATH`` (pyvoy imports ``app`` inside Envoy)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}


def _h2corn(threads: int | None, target: str = "app") -> Callable[[int], list[str]]:
    def command(port: int) -> list[str]:
        extra = [] if threads is None else ["--runtime-threads", str(threads)]
        return [sys.executable, "-m", "h2corn", f"grpc_asgi_floor:{target}", "--bind",
                f"127.0.0.1:{port}", "--workers", "1", "--grpc", "--lifespan", "on", "--no-access-log", *extra]

    return command


def _pyvoy(concurrency: int | None, target: str = "app") -> Callable[[int], list[str]]:
    def command(port: int) -> list[str]:
        extra = [] if concurrency is None else ["--", "--concurrency", str(concurrency)]
        return [str(Path(sys.executable).with_name("pyvoy")), f"grpc_asgi_floor:{target}", "--address", "127.0.0.1",
                "--port", str(port), "--lifespan", "--log-level", "error", *extra]

    return command


SERVERS = {
    "h2corn": Server(("h2corn",), _h2corn(None)),
    "h2corn-1t": Server(("h2corn",), _h2corn(1)),
    "pyvoy": Server(("pyvoy",), _pyvoy(None)),
    "pyvoy-1t": Server(("pyvoy",), _pyvoy(1)),
    "h2corn-connect": Server(("h2corn", "connectrpc"), _h2corn(None, "connect_app")),
    "pyvoy-connect": Server(("pyvoy", "connectrpc"), _pyvoy(None, "connect_app")),
}
"""The ASGI gRPC variants by name."""
