"""A front-end worker process: HTTP and gRPC on the public ports (SO_REUSEPORT), tensors to the engine.

Started by :class:`~streamrt.serve.listeners.frontends.supervisor.FrontendSupervisor` as
``python -m streamrt.serve.listeners.frontends.worker`` with its spec (pickled) on stdin and two inherited
descriptors: its end of the tensor channel and its arena (a memfd). Inference requests are parsed
here, with their tensors written into the arena (an HTTP body is read straight into it) and sent
to the engine process as a small descriptor (:mod:`.channel`, :mod:`.tensors`); the response is
serialised here from the arena. Every other call (health, metadata, config, statistics,
repository, shared-memory registration, unimplemented extensions) is forwarded unchanged to the
engine process's own HTTP / gRPC handlers on private Unix sockets, so they answer exactly what
the one-process server answers. The listeners are the one-process server's own
(:class:`~streamrt.serve.listeners.http.InferenceRoutes`, :class:`~streamrt.serve.listeners.grpc_service.InferenceRpcs`)
over :class:`EngineLink`, this process's :class:`~streamrt.serve.port.InferencePort`: auth,
tracing, shared memory, sequence flags and compression are those listeners', written once.

The worker exits when the engine process says STOP, on SIGTERM, or when the channel closes (the
engine process is gone): it never outlives the server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np

from streamrt.device.cpus import pin_process
from streamrt.errors import ServerShuttingDownError
from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.listeners.frontends.arena import Arena
from streamrt.serve.listeners.frontends.channel import (
    ERROR,
    FREE,
    HELLO,
    INFER,
    OK,
    STOP,
    FrameReader,
    FrameWriter,
    raise_error,
)
from streamrt.serve.listeners.frontends.tensors import DeferredRegions, pack_request_tensors, unpack_outputs
from streamrt.serve.listeners.http_forward import HttpForwarder
from streamrt.serve.port import RequestBuffer, check_bearer, close_each
from streamrt.serve.process import configure_serving_process, settle_heap
from streamrt.serve.wire.protocol import InferRequest, InferResponse

__all__ = ["EngineLink", "GrpcForwarder", "HttpForwarder", "build_http_app", "main"]

log = logging.getLogger("streamrt.serve.listeners.frontends.worker")

T = TypeVar("T")

class EngineLink:
    """The worker's end of the tensor channel: sends INFER messages, matches replies to requests.
    It is also the :class:`~streamrt.serve.port.InferencePort` of the worker's listeners.

    Input blocks are freed when the reply arrives, never earlier (a request whose client went away
    keeps its blocks until the engine process is done with them).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, arena: Arena,
                 config: ServerConfig | None = None) -> None:
        self.reader, self.writer, self.arena = reader, FrameWriter(writer), arena
        self.config = config or ServerConfig()
        self.regions = DeferredRegions()  # the engine process holds the regions: names travel
        self._pending: dict[int, tuple[asyncio.Future[tuple[Any, ...]], list[int]]] = {}
        self._next = 0
        self.closed = asyncio.Event()
        self.active = 0  # inference calls between parsing and their response being handed to the listener
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.active += 1
        self._idle.clear()

    def leave(self) -> None:
        self.active -= 1
        if not self.active:
            self._idle.set()

    async def drained(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until no inference call is between request and response."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("%d requests still being answered after %.0f s", self.active, timeout)

    async def run(self) -> None:
        """Read replies until STOP or the end of the channel."""
        frames = FrameReader(self.reader)
        while (messages := await frames.read()) is not None:
            stop = next((i for i, m in enumerate(messages) if m[0] == STOP), None)
            self._answer(messages[:stop])
            if stop is not None:
                break
        for future, _ in self._pending.values():
            if not future.done():
                future.set_exception(ServerShuttingDownError("the engine process is gone; retry"))
        self.closed.set()

    def _answer(self, replies: list[tuple[Any, ...]]) -> None:
        for reply in replies:
            future, taken = self._pending.pop(reply[1])
            for offset in taken:
                self.arena.inputs.free(offset)
            if future.cancelled():  # the client went away: give the output blocks back at once
                if reply[0] == OK:
                    self.free_outputs(_blocks(reply))
                continue
            future.set_result(reply)

    async def infer(self, request: InferRequest, taken: list[int]) -> tuple[InferResponse, list[int]]:
        """Run ``request`` in the engine process; returns the response (views of the arena) and its
        output blocks (give them back with :meth:`free_outputs` once serialised). ``taken``: input
        blocks already holding the request's data (freed with the reply)."""
        if self.closed.is_set():
            for offset in taken:
                self.arena.inputs.free(offset)
            raise ServerShuttingDownError("the server is shutting down and accepts no new requests")
        try:
            inputs, outputs = pack_request_tensors(request, self.arena, taken)
        except BaseException:
            for offset in taken:
                self.arena.inputs.free(offset)
            raise
        rid = self._next = self._next + 1
        future: asyncio.Future[tuple[Any, ...]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (future, taken)
        self.writer.send((INFER, rid, request.model, request.version, request.id, request.priority,
                          request.timeout_us, request.binary_output, request.received_ns, inputs, outputs,
                          request.sequence, request.trace_parent))
        reply = await future
        if reply[0] == ERROR:
            raise_error(*reply[2:5])
        return unpack_outputs(reply, self.arena), _blocks(reply)

    def free_outputs(self, blocks: list[int]) -> None:
        if blocks and not self.writer.is_closing():
            self.writer.send((FREE, blocks))

    # --- the listeners' InferencePort -----------------------------------------------------------

    def check_auth(self, header: str | None) -> None:
        """The core's check, here (the engine process checks the calls forwarded to it itself)."""
        check_bearer(self.config.auth_token, header)

    def request_buffer(self, nbytes: int) -> RequestBuffer:
        """A block of the arena's input half (the body lands in shared memory: no copy to send it),
        or plain memory when the arena is full (the tensors then travel in the message)."""
        offset = self.arena.inputs.alloc(nbytes)
        if offset is None:
            return RequestBuffer(np.empty(nbytes, np.uint8))
        return RequestBuffer(self.arena.view(offset, nbytes), offset, self.arena.inputs.free)

    async def answer(self, request: InferRequest, encode: Callable[[InferResponse], T],
                     buffer: RequestBuffer | None = None) -> T:
        """:meth:`infer` for the listeners: ``encode`` runs on the arena views, then the output
        blocks go back. Counted by :meth:`drained` until the response is encoded."""
        self.enter()
        try:
            taken = [] if buffer is None or buffer.block is None else [buffer.block]
            response, blocks = await self.infer(request, taken)
            try:
                return encode(response)
            finally:
                self.free_outputs(blocks)
        finally:
            self.leave()


def _blocks(reply: tuple[Any, ...]) -> list[int]:
    return [where[1] for _, _, _, where in reply[5] if where[0] == "a"]


# --- the other routes: forwarded to the engine process ----------------------------------------------


def build_http_app(link: EngineLink, control_socket: str) -> Any:
    """The worker's aiohttp app: the inference routes over ``link``, every other route forwarded."""
    from streamrt.serve.listeners.http import InferenceRoutes

    forwarder = HttpForwarder(control_socket)
    app = InferenceRoutes(link).app(fallback=forwarder)
    app.on_cleanup.append(forwarder.close)
    return app


class GrpcForwarder:
    """The :data:`~streamrt.serve.listeners.grpc_service.UNARY_RPCS` forwarded, as bytes, to the engine
    process's own gRPC service (on a private Unix socket)."""

    def __init__(self, control_socket: str) -> None:
        from streamrt.serve.listeners.grpc_service import import_grpc

        self.grpc = import_grpc()
        self.channel = self.grpc.aio.insecure_channel(f"unix:{control_socket}", options=[
            ("grpc.max_receive_message_length", 2**31 - 1), ("grpc.max_send_message_length", 2**31 - 1)])

    def forwarder(self, method: str) -> Any:
        call = self.channel.unary_unary(method)  # no (de)serializers: bytes in, bytes out

        async def forward(request: bytes, context: Any) -> Any:
            metadata = tuple((k, v) for k, v in (context.invocation_metadata() or ())
                             if not k.startswith((":", "grpc-")) and k != "user-agent")
            try:
                # bytes(): grpcio sends bytes only; h2corn's listener hands a view of the request (small here)
                return await call(bytes(request), metadata=metadata, timeout=context.time_remaining())
            except self.grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")

        return forward

    def handlers(self) -> dict[str, Any]:
        from streamrt.serve.listeners.grpc_service import UNARY_RPCS
        from streamrt.serve.wire.proto import SERVICE

        return {name: self.grpc.unary_unary_rpc_method_handler(self.forwarder(f"/{SERVICE}/{name}"))
                for name in UNARY_RPCS}


# --- process ---------------------------------------------------------------------------------------


async def serve(spec: dict[str, Any]) -> None:
    """Bind the public ports, say HELLO, serve until STOP / SIGTERM / the engine process is gone."""
    config: ServerConfig = spec["config"]
    arena = Arena(spec["arena_fd"], spec["arena_bytes"])
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=spec["channel_fd"]))
    link = EngineLink(reader, writer, arena, config)
    closers: list[Callable[[], Awaitable[Any]]] = []
    if spec["http_port"] is not None and config.http_server == "h2corn":
        from streamrt.serve.listeners.http_h2corn import start_http_h2corn

        stop_http, _ = await start_http_h2corn(link, config.host, spec["http_port"], forward_to=spec["http_socket"],
                                               reuse_port=True, threads=config.grpc_threads)
        closers.append(stop_http)
    elif spec["http_port"] is not None:
        from aiohttp import web

        runner = web.AppRunner(build_http_app(link, spec["http_socket"]), access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, config.host, spec["http_port"], reuse_address=True, reuse_port=True).start()
        closers.append(runner.cleanup)
    if spec["grpc_port"] is not None:
        from streamrt.serve.listeners.grpc_service import InferenceRpcs, listen_grpc

        forwarder = GrpcForwarder(spec["grpc_socket"])
        stop_grpc, _ = await listen_grpc(InferenceRpcs(link).method_handlers(forwarder.handlers()), config.grpc_server,
                                         config.host, spec["grpc_port"], config.grpc_max_message_bytes, reuse_port=True,
                                         threads=config.grpc_threads)
        closers.append(forwarder.channel.close)  # closed after the server (newest first)
        closers.append(stop_grpc)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, link.closed.set)
    settle_heap()  # what serving the listeners needs is loaded
    link.writer.send((HELLO, os.getpid()))
    reading = loop.create_task(link.run())
    await link.closed.wait()
    await link.drained(10.0)  # replies already received still reach their clients
    await close_each(closers, "a listener")
    reading.cancel()
    writer.close()
    arena.close()


def main() -> None:
    spec = pickle.loads(sys.stdin.buffer.read())
    if spec.get("cpus"):  # --engine-cpus: the front ends on the CPUs the engine process left them
        pin_process(os.getpid(), spec["cpus"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the engine process, which stops us in order
    logging.basicConfig(level=spec["log_level"], stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s frontend[{spec['index']}] %(name)s: %(message)s")
    for noisy in ("aiohttp.access", "grpc", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from streamrt.serve.listeners.http import quiet_bad_requests

    quiet_bad_requests()  # a malformed request is one warning line, not a traceback
    configure_serving_process()
    try:  # as `streamrt serve --event-loop auto`: uvloop when it is installed
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve(spec))
    finally:
        loop.close()

if __name__ == "__main__":
    main()
