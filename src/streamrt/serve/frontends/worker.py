"""A front-end worker process: HTTP and gRPC on the public ports (SO_REUSEPORT), tensors to the engine.

Started by :class:`~streamrt.serve.frontends.supervisor.FrontendSupervisor` as
``python -m streamrt.serve.frontends.worker`` with its spec (pickled) on stdin and two inherited
descriptors: its end of the tensor channel and its arena (a memfd). Inference requests are parsed
here, with their tensors written into the arena (an HTTP body is read straight into it) and sent
to the engine process as a small descriptor (:mod:`.channel`, :mod:`.tensors`); the response is
serialised here from the arena. Every other call (health, metadata, config, statistics,
repository, shared-memory registration, unimplemented extensions) is forwarded unchanged to the
engine process's own HTTP / gRPC handlers on private Unix sockets, so they answer exactly what
the one-process server answers. Auth is checked here for inference and by the engine for the rest.

The worker exits when the engine process says STOP, on SIGTERM, or when the channel closes (the
engine process is gone): it never outlives the server.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import pickle
import signal
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

from streamrt.errors import (
    PayloadTooLargeError,
    ServerShuttingDownError,
    StreamRTError,
    UnauthorizedError,
    UnsupportedRequestError,
)
from streamrt.serve.config import ServerConfig
from streamrt.serve.frontends.arena import Arena
from streamrt.serve.frontends.channel import (
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
from streamrt.serve.frontends.tensors import DeferredRegions, pack_request_tensors, unpack_outputs
from streamrt.serve.process import configure_serving_process, settle_heap
from streamrt.serve.protocol import HEADER_LENGTH, InferRequest, InferResponse
from streamrt.serve.status import status_for

__all__ = ["EngineLink", "main"]

log = logging.getLogger("streamrt.serve.frontends.worker")

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}


def check_auth(config: ServerConfig, header: str | None) -> None:
    """:meth:`ServerCore.check_auth` for the worker (same token, same message)."""
    token = config.auth_token
    if token is None:
        return
    given = (header or "").removeprefix("Bearer ").strip() if (header or "").startswith("Bearer ") else ""
    if not given or not hmac.compare_digest(given.encode(), token.encode()):
        raise UnauthorizedError("missing or wrong bearer token", hint="send 'Authorization: Bearer <token>'")


class EngineLink:
    """The worker's end of the tensor channel: sends INFER messages, matches replies to requests.

    Input blocks are freed when the reply arrives, never earlier (a request whose client went away
    keeps its blocks until the engine process is done with them).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, arena: Arena) -> None:
        self.reader, self.writer, self.arena = reader, FrameWriter(writer), arena
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


def _blocks(reply: tuple[Any, ...]) -> list[int]:
    return [where[1] for _, _, _, where in reply[5] if where[0] == "a"]


# --- HTTP ------------------------------------------------------------------------------------------


def build_http_app(link: EngineLink, config: ServerConfig, control_socket: str) -> Any:
    """The worker's aiohttp app: inference here, every other route forwarded to the engine process."""
    from aiohttp import ClientSession, ClientTimeout, UnixConnector, web

    from streamrt.serve.http import infer_reply, json_header_length, read_body
    from streamrt.serve.protocol import decode_http_request, encode_http_response

    limit = config.max_request_bytes
    regions = DeferredRegions()
    arena = link.arena
    session: list[ClientSession] = []

    async def infer(request: web.Request) -> web.StreamResponse:
        link.enter()
        try:
            return await answer(request)
        finally:
            link.leave()

    async def answer(request: web.Request) -> web.StreamResponse:
        taken: list[int] = []
        try:
            check_auth(config, request.headers.get("Authorization"))
            length = request.content_length
            if length is not None and length > limit:
                raise PayloadTooLargeError(f"request body of {length} bytes exceeds the limit of {limit}")
            encoding = request.headers.get("Content-Encoding", "identity").lower()
            if encoding not in ("identity", "", "gzip", "deflate"):
                raise UnsupportedRequestError(
                    f"Content-Encoding '{encoding}' is not supported; use gzip, deflate or identity")
            body: Any
            if encoding in ("identity", "") and length:
                offset = arena.inputs.alloc(length)
                if offset is not None:
                    taken.append(offset)
                body = await read_body(request, None if offset is None else arena.view(offset, length))
            else:
                body = await request.read()
            infer_request = decode_http_request(
                body, json_header_length(request), model=request.match_info["model"],
                version=request.match_info.get("version", ""), max_elements=config.max_tensor_elements,
                memory=regions)  # type: ignore[arg-type]
            infer_request.trace_parent = request.headers.get("traceparent")
            handed, taken = taken, []
            response, blocks = await link.infer(infer_request, handed)
            try:
                payload, json_length = encode_http_response(response, infer_request)
            finally:
                link.free_outputs(blocks)
        except StreamRTError as exc:
            return web.json_response({"error": str(exc)}, status=status_for(exc).http)
        except web.HTTPRequestEntityTooLarge:
            return web.json_response({"error": f"request body exceeds the server limit of {limit} bytes"}, status=413)
        finally:
            for offset in taken:  # not handed to the engine process (the request failed before)
                arena.inputs.free(offset)
        return infer_reply(request, payload, json_length)

    async def forward(request: web.Request) -> web.StreamResponse:
        if not session:
            # no timeout of our own: a load request may build an engine for minutes, as in one process
            session.append(ClientSession(connector=UnixConnector(path=control_socket), auto_decompress=False,
                                         timeout=ClientTimeout(total=None)))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        body = await request.read()
        try:
            async with session[0].request(request.method, f"http://engine{request.rel_url}", headers=headers,
                                          data=body or None, allow_redirects=False) as answer:
                data = await answer.read()
                kept = {k: v for k, v in answer.headers.items()
                        if k.lower() in ("content-type", "content-encoding", HEADER_LENGTH.lower())}
                return web.Response(status=answer.status, body=data, headers=kept)
        except OSError:
            return web.json_response({"error": "the engine process is not answering; retry"}, status=503)

    async def close_session(app: web.Application) -> None:
        if session:
            await session[0].close()

    app = web.Application(client_max_size=limit)
    app.router.add_route("POST", "/v2/models/{model}/infer", infer)
    app.router.add_route("POST", "/v2/models/{model}/versions/{version}/infer", infer)
    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_cleanup.append(close_session)
    return app


# --- gRPC ------------------------------------------------------------------------------------------


class WorkerGrpc:
    """ModelInfer / ModelStreamInfer here; the other RPCs forwarded to the engine process's gRPC service."""

    def __init__(self, link: EngineLink, config: ServerConfig, control_socket: str) -> None:
        from streamrt.serve.grpc_service import import_grpc
        from streamrt.serve.proto import messages

        self.grpc = import_grpc()
        self.messages = messages
        self.link, self.config = link, config
        self.regions = DeferredRegions()
        self.channel = self.grpc.aio.insecure_channel(f"unix:{control_socket}", options=[
            ("grpc.max_receive_message_length", 2**31 - 1), ("grpc.max_send_message_length", 2**31 - 1)])

    async def _infer(self, data: bytes, traceparent: str | None = None) -> bytes:
        from streamrt.serve.grpc_service import parse_infer_request, serialize_grpc_response

        request = parse_infer_request(data, self.config.max_tensor_elements, self.regions)  # type: ignore[arg-type]
        request.trace_parent = traceparent
        response, blocks = await self.link.infer(request, [])
        try:
            return serialize_grpc_response(response)
        finally:
            self.link.free_outputs(blocks)

    def _auth(self, context: Any) -> None:
        check_auth(self.config, dict(context.invocation_metadata() or ()).get("authorization"))

    async def ModelInfer(self, request: bytes, context: Any) -> Any:
        self.link.enter()
        try:
            self._auth(context)
            return await self._infer(request, dict(context.invocation_metadata() or ()).get("traceparent"))
        except StreamRTError as exc:
            await context.abort(self.grpc.StatusCode[status_for(exc).grpc], str(exc))
        finally:
            self.link.leave()

    async def ModelStreamInfer(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        from streamrt.serve.grpc_wire import encode_length_delimited

        try:
            self._auth(context)
        except StreamRTError as exc:
            await context.abort(self.grpc.StatusCode[status_for(exc).grpc], str(exc))
        traceparent = dict(context.invocation_metadata() or ()).get("traceparent")
        async for request in requests:
            try:
                yield encode_length_delimited(2, await self._infer(request, traceparent))
            except StreamRTError as exc:
                yield self.messages.ModelStreamInferResponse(error_message=str(exc)).SerializeToString()

    def forwarder(self, method: str) -> Any:
        call = self.channel.unary_unary(method)  # no (de)serializers: bytes in, bytes out

        async def forward(request: bytes, context: Any) -> Any:
            metadata = tuple((k, v) for k, v in (context.invocation_metadata() or ())
                             if not k.startswith((":", "grpc-")) and k != "user-agent")
            try:
                return await call(request, metadata=metadata, timeout=context.time_remaining())
            except self.grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")

        return forward

    def handler(self) -> Any:
        from streamrt.serve.grpc_service import _UNARY
        from streamrt.serve.proto import SERVICE

        grpc = self.grpc
        handlers = {name: grpc.unary_unary_rpc_method_handler(self.forwarder(f"/{SERVICE}/{name}"))
                    for name in _UNARY}
        handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(self.ModelInfer)
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(self.ModelStreamInfer)
        return grpc.method_handlers_generic_handler(SERVICE, handlers)


# --- process ---------------------------------------------------------------------------------------


async def serve(spec: dict[str, Any]) -> None:
    """Bind the public ports, say HELLO, serve until STOP / SIGTERM / the engine process is gone."""
    config: ServerConfig = spec["config"]
    arena = Arena(spec["arena_fd"], spec["arena_bytes"])
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=spec["channel_fd"]))
    link = EngineLink(reader, writer, arena)
    closers = []
    if spec["http_port"] is not None:
        from aiohttp import web

        runner = web.AppRunner(build_http_app(link, config, spec["http_socket"]), access_log=None,
                               handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, config.host, spec["http_port"], reuse_address=True, reuse_port=True).start()
        closers.append(runner.cleanup)
    if spec["grpc_port"] is not None:
        service = WorkerGrpc(link, config, spec["grpc_socket"])
        server = service.grpc.aio.server(options=[
            ("grpc.max_receive_message_length", config.grpc_max_message_bytes),
            ("grpc.max_send_message_length", 2**31 - 1),
            ("grpc.so_reuseport", 1),
        ])
        server.add_generic_rpc_handlers((service.handler(),))
        if server.add_insecure_port(f"{config.host}:{spec['grpc_port']}") == 0:
            raise OSError(f"front-end worker {spec['index']}: cannot bind gRPC port {spec['grpc_port']}")
        await server.start()
        closers.append(lambda: server.stop(grace=1.0))
        closers.append(service.channel.close)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, link.closed.set)
    settle_heap()  # what serving the listeners needs is loaded
    link.writer.send((HELLO, os.getpid()))
    reading = loop.create_task(link.run())
    await link.closed.wait()
    await link.drained(10.0)  # replies already received still reach their clients
    for close in closers:
        try:
            await close()
        except Exception:
            log.warning("closing a listener failed", exc_info=True)
    reading.cancel()
    writer.close()
    arena.close()


def main() -> None:
    spec = pickle.loads(sys.stdin.buffer.read())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the engine process, which stops us in order
    logging.basicConfig(level=spec["log_level"], stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s frontend[{spec['index']}] %(name)s: %(message)s")
    for noisy in ("aiohttp.access", "grpc", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from streamrt.serve.http import quiet_bad_requests

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
