"""The inference port: the HTTP and gRPC listeners run over any :class:`InferencePort` (here a
small doubling port written for the test, not a server core), both real ports implement it, and
the bearer-token check is one function."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from streamrt.errors import UnauthorizedError
from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.core import ServerCore
from streamrt.serve.port import InferencePort, RequestBuffer, check_bearer
from streamrt.serve.wire.protocol import HEADER_LENGTH, InferRequest, InferResponse
from streamrt.serve.wire.shared_memory import SharedMemoryRegistry

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")
AUTH = {"Authorization": "Bearer s3cret"}


class DoublingPort:
    """A port that answers ``y = 2 x`` itself and records what the listener handed it."""

    def __init__(self) -> None:
        self.config = ServerConfig(auth_token="s3cret")
        self.regions = SharedMemoryRegistry()
        self.buffers: list[RequestBuffer] = []
        self.released: list[int] = []
        self.answered: list[tuple[InferRequest, RequestBuffer | None]] = []

    def check_auth(self, header: str | None) -> None:
        check_bearer(self.config.auth_token, header)

    def request_buffer(self, nbytes: int) -> RequestBuffer:
        buffer = RequestBuffer(np.full(nbytes, 0xAB, np.uint8), len(self.buffers), self.released.append)
        self.buffers.append(buffer)
        return buffer

    async def answer(self, request: InferRequest, encode: Callable[[InferResponse], T],
                     buffer: RequestBuffer | None = None) -> T:
        self.answered.append((request, buffer))
        outputs = {"y": 2 * np.asarray(request.inputs["x"])}
        return encode(InferResponse(request.model, "1", request.id, outputs))


def _binary_body(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"id": "r1", "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                                 "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return header + x.tobytes(), {HEADER_LENGTH: str(len(header)), "Content-Type": "application/octet-stream"}


def _binary_output(data: bytes, length: int) -> np.ndarray:
    header = json.loads(data[:length])
    assert header["outputs"][0]["name"] == "y" and header["id"] == "r1"
    return np.frombuffer(data[length:], np.float32).reshape(header["outputs"][0]["shape"])


def test_core_and_engine_link_are_ports(tmp_path: Path) -> None:
    from streamrt.serve.listeners.frontends.worker import EngineLink

    assert isinstance(ServerCore(tmp_path), InferencePort)
    if not hasattr(os, "memfd_create"):
        return
    from streamrt.serve.listeners.frontends.arena import Arena

    async def link() -> Any:
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        arena = Arena.create(1 << 20)
        try:
            port = EngineLink(reader, writer, arena, ServerConfig(auth_token="t"))
            assert isinstance(port, InferencePort)
            block = port.request_buffer(1000)  # a block of the arena's input half, given back by release
            assert block.block is not None and arena.offset_of(block.array) == block.block
            assert arena.inputs.used > 0
            block.release()
            block.release()  # once only
            assert arena.inputs.used == 0
            with pytest.raises(UnauthorizedError):
                port.check_auth("Bearer nope")
        finally:
            writer.close()
            theirs.close()
            arena.close()

    asyncio.run(link())


@pytest.mark.parametrize(("header", "ok"), [
    ("Bearer s3cret", True), ("Bearer  s3cret ", True), (None, False), ("", False), ("Bearer", False),
    ("Bearer nope", False), ("bearer s3cret", False), ("Basic s3cret", False), ("s3cret", False),
])
def test_check_bearer(header: str | None, ok: bool) -> None:
    check_bearer(None, header)  # no token set: everything passes
    if ok:
        check_bearer("s3cret", header)
        return
    with pytest.raises(UnauthorizedError, match="bearer token") as failure:
        check_bearer("s3cret", header)
    assert "Authorization: Bearer" in str(failure.value.hint)


def test_http_listener_runs_over_any_port() -> None:
    """Body read into the port's buffer (tensors are views of it), auth and errors by the listener,
    a failed parse gives the buffer back, gzip bodies bypass it, other routes reach the fallback."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from streamrt.serve.listeners.http import InferenceRoutes

    port = DoublingPort()
    x = np.random.default_rng().standard_normal((2, 5)).astype(np.float32)
    body, headers = _binary_body(x)

    async def fallback(request: web.Request) -> web.Response:
        return web.Response(status=299, text=request.path)

    async def run() -> None:
        async with TestClient(TestServer(InferenceRoutes(port).app(fallback=fallback))) as client:
            reply = await client.post("/v2/models/m/infer", data=body, headers=headers)
            assert reply.status == 401 and "bearer token" in (await reply.json())["error"]
            assert port.buffers == [] and port.answered == []  # refused before any body was read

            reply = await client.post("/v2/models/m/versions/3/infer", data=body, headers={**headers, **AUTH})
            assert reply.status == 200
            got = _binary_output(await reply.read(), int(reply.headers[HEADER_LENGTH]))
            np.testing.assert_array_equal(got, 2 * x)
            request, buffer = port.answered[-1]
            assert (request.model, request.version) == ("m", "3") and buffer is port.buffers[0]
            assert np.shares_memory(request.inputs["x"], buffer.array)  # zero-copy view of the port's memory
            assert port.released == []  # the port owns the buffer once answer() has it

            reply = await client.post("/v2/models/m/infer", data=b"{not json", headers=AUTH)
            assert reply.status == 400 and "malformed JSON" in (await reply.json())["error"]
            assert port.released == [1] and len(port.answered) == 1  # the failed request's buffer came back

            packed = gzip.compress(body)
            reply = await client.post("/v2/models/m/infer", data=packed,
                                      headers={**headers, **AUTH, "Content-Encoding": "gzip"})
            assert reply.status == 200 and port.answered[-1][1] is None and len(port.buffers) == 2
            np.testing.assert_array_equal(_binary_output(await reply.read(), int(reply.headers[HEADER_LENGTH])),
                                          2 * x)

            reply = await client.get("/v2/health/ready")  # no token needed, answered by the fallback
            assert reply.status == 299 and await reply.text() == "/v2/health/ready"
            reply = await client.get("/v2/models/m/config")
            assert reply.status == 401

    asyncio.run(run())


def test_http_replies_are_compressed_only_from_1_kib() -> None:
    """A client that accepts gzip gets a small reply identity-encoded and a large one gzipped, with
    the same bytes once decoded (aiohttp's client decodes; ``auto_decompress=False`` shows the wire)."""
    from aiohttp.test_utils import TestClient, TestServer

    from streamrt.serve.listeners.http import COMPRESS_MIN_BYTES, InferenceRoutes

    port = DoublingPort()
    rng = np.random.default_rng()
    small = rng.standard_normal((1, 4)).astype(np.float32)
    large = rng.standard_normal((1, COMPRESS_MIN_BYTES)).astype(np.float32)

    async def run() -> None:
        server = TestServer(InferenceRoutes(port).app())
        async with TestClient(server, auto_decompress=False) as client:
            for x, encoding in ((small, None), (large, "gzip")):
                body, headers = _binary_body(x)
                reply = await client.post("/v2/models/m/infer", data=body,
                                          headers={**headers, **AUTH, "Accept-Encoding": "gzip"})
                assert reply.status == 200 and reply.headers.get("Content-Encoding") == encoding
                data = await reply.read()
                data = gzip.decompress(data) if encoding else data
                np.testing.assert_array_equal(_binary_output(data, int(reply.headers[HEADER_LENGTH])), 2 * x)

    asyncio.run(run())


def test_grpc_listener_runs_over_any_port() -> None:
    """ModelInfer and ModelStreamInfer over the port, the token checked by the listener, and the
    unary RPCs exactly those handed in (none here: UNIMPLEMENTED)."""
    pytest.importorskip("grpc")
    import grpc

    from streamrt.serve.listeners.grpc_service import InferenceRpcs, grpc_server
    from streamrt.serve.wire.proto import SERVICE, messages

    port = DoublingPort()
    x = np.random.default_rng().standard_normal((3, 4)).astype(np.float32)
    request = messages.ModelInferRequest(model_name="m", id="g1")
    request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())

    async def run() -> None:
        server = grpc_server(1 << 20)
        server.add_generic_rpc_handlers((InferenceRpcs(port).handler({}),))
        bound = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{bound}") as channel:
                infer = channel.unary_unary(f"/{SERVICE}/ModelInfer",
                                            request_serializer=lambda m: m.SerializeToString(),
                                            response_deserializer=messages.ModelInferResponse.FromString)
                with pytest.raises(grpc.aio.AioRpcError) as failure:
                    await infer(request)
                assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "bearer token" in (failure.value.details() or "")
                metadata = (("authorization", "Bearer s3cret"), ("traceparent", "00-ab-cd-01"))
                response = await infer(request, metadata=metadata)
                assert response.id == "g1" and response.outputs[0].name == "y"
                np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), 2 * x.ravel())
                assert port.answered[-1][0].trace_parent == "00-ab-cd-01"

                stream = channel.stream_stream(f"/{SERVICE}/ModelStreamInfer",
                                               request_serializer=lambda m: m.SerializeToString(),
                                               response_deserializer=messages.ModelStreamInferResponse.FromString)
                answers = [a async for a in stream(iter([request, request]), metadata=metadata)]
                assert [a.infer_response.id for a in answers] == ["g1", "g1"]
                assert all(not a.error_message for a in answers)

                metadata_call = channel.unary_unary(f"/{SERVICE}/ServerMetadata",
                                                    request_serializer=lambda m: m.SerializeToString(),
                                                    response_deserializer=messages.ServerMetadataResponse.FromString)
                with pytest.raises(grpc.aio.AioRpcError) as failure:
                    await metadata_call(messages.ServerMetadataRequest(), metadata=metadata)
                assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            await server.stop(None)

    asyncio.run(run())


def test_a_busy_grpc_port_is_one_config_error_naming_it() -> None:
    """grpcio 1.85 raises RuntimeError("Failed to bind ...") where older versions returned 0: either
    way the listener says which port and which flag, and nothing else reaches the log."""
    pytest.importorskip("grpc")
    from streamrt.errors import ConfigError
    from streamrt.serve.listeners.grpc_service import bind_grpc, start_grpc

    class Refusing:
        def add_insecure_port(self, address: str) -> int:
            raise RuntimeError(f"Failed to bind to address {address}; set GRPC_VERBOSITY=debug for more")

    assert bind_grpc(Refusing(), "127.0.0.1:1") == 0
    core = ServerCore("unused", ServerConfig())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as err:
            asyncio.run(start_grpc(core, "127.0.0.1", port))
    assert str(err.value) == (f"cannot listen for gRPC on 127.0.0.1:{port}: the port is already in use (another "
                              "server running?) (hint: --grpc-port N with a free port, or --grpc-port 0 to pick any)")
