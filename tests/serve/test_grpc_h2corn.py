"""gRPC served by h2corn (``--grpc-server h2corn``): the tritonclient gRPC tests of test_tritonclient.py against it
(test_triton_repo.py runs its Triton examples on it too), grpcio's statuses for the listener's own refusals,
and the configuration errors."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("h2corn")
pytest.importorskip("tritonclient.grpc")

import grpc as grpclib
import tritonclient.grpc as tgrpc
from tests.serve.conftest import fake_loader, make_repo, server_config, serving
from tests.serve.test_tritonclient import (  # noqa: F401  (re-run here, against h2corn)
    grpc,
    http,
    test_errors_reach_the_client,
    test_failed_load_is_unavailable_with_reason,
    test_grpc_infer_sync_async_and_stream,
    test_grpc_typed_contents_request,
    test_health_and_metadata_grpc,
    test_repository_index_load_unload,
    test_statistics_http_and_grpc,
)
from tritonclient.utils import InferenceServerException

from streamrt.errors import ConfigError
from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.listeners.grpc_h2corn import _timeout_s, percent_encode
from streamrt.serve.server import ServerThread

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, plans: dict[str, Path]) -> Iterator[ServerThread]:
    yield from serving(tmp_path_factory, plans, grpc_server="h2corn")


def _raw(server: ServerThread, method: str, payload: bytes) -> grpclib.RpcError:
    with grpclib.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        with pytest.raises(grpclib.RpcError) as err:
            call(payload, timeout=10)
    return err.value


def test_unknown_method_is_unimplemented_and_bytes_are_internal(server: ServerThread) -> None:
    error = _raw(server, "NoSuchRpc", b"")
    assert error.code() == grpclib.StatusCode.UNIMPLEMENTED and "NoSuchRpc" in (error.details() or "")
    error = _raw(server, "ModelInfer", b"\xff" * 64)
    assert error.code() == grpclib.StatusCode.INTERNAL and error.details() == "Unable to parse request"


def test_a_message_over_the_limit_is_resource_exhausted(tmp_path: Path, plans: dict[str, Path]) -> None:
    repo = make_repo(tmp_path / "repo", plans)
    config = server_config(grpc_server="h2corn", http_port=None, metrics_port=None, grpc_max_message_bytes=4096)
    with ServerThread(repo, config, engine_loader=fake_loader, start_timeout=120) as running:
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
        x = tgrpc.InferInput("x", [1, 3, 32, 32], "FP32")  # 12 KiB of tensor
        x.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
        with pytest.raises(InferenceServerException, match="larger than max") as err:
            client.infer("cnn", [x])
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert client.is_server_live()  # the connection and the server survive it
        client.close()


def test_grpc_message_and_timeout_encodings() -> None:
    assert percent_encode("plain text: ok") == b"plain text: ok"
    assert percent_encode("100% sure\n") == b"100%25 sure%0A"
    assert percent_encode("é") == b"%C3%A9"
    assert _timeout_s("100m") == pytest.approx(0.1) and _timeout_s("5S") == 5.0 and _timeout_s("2H") == 7200.0
    assert _timeout_s("oops") == float("inf")


def test_configuration_errors_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="unknown gRPC server 'tonic'"):
        ServerConfig(grpc_server="tonic")
    monkeypatch.setitem(sys.modules, "h2corn", None)  # as if it were not installed
    with pytest.raises(ConfigError, match="needs the h2corn package") as err:
        ServerConfig(grpc_server="h2corn")
    assert "pip install 'streamrt[fast-grpc]'" in str(err.value)


def test_tokio_threads_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """``grpc_threads``: only for h2corn, not negative; 0 picks one thread on a 2-CPU process, h2corn's
    default on a larger one; the setting reaches h2corn's Config."""
    from streamrt.serve.listeners import grpc_h2corn, h2corn_server

    with pytest.raises(ConfigError, match="grpc_threads sets h2corn's Tokio threads; neither gRPC nor HTTP"):
        ServerConfig(grpc_threads=1)
    with pytest.raises(ConfigError, match="grpc_threads must be an integer >= 0"):
        ServerConfig(grpc_server="h2corn", grpc_threads=-1)
    monkeypatch.setattr(h2corn_server.os, "sched_getaffinity", lambda pid: {0, 1})
    assert grpc_h2corn.default_threads() == 1
    monkeypatch.setattr(h2corn_server.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert grpc_h2corn.default_threads() == 0

    # h2corn's Tokio runtime is process-global (set by the first server of the process): the Config is looked at,
    # not served, so that this test leaves the process's runtime to the other tests
    seen: list[int | None] = []
    h2corn = pytest.importorskip("h2corn")

    class Seen(Exception):
        pass

    def config(**kwargs: Any) -> Any:
        seen.append(kwargs.get("runtime_threads"))
        raise Seen

    monkeypatch.setattr(h2corn, "Config", config)
    for threads in (3, 0):  # 0 with 16 CPUs (patched above): h2corn's own default
        with pytest.raises(Seen):
            asyncio.run(grpc_h2corn.start_grpc_h2corn({}, "s.S", "127.0.0.1", 0, 1024, threads=threads))
    assert seen == [3, None]


def test_a_busy_port_is_one_config_error(tmp_path: Path) -> None:
    from streamrt.serve.core import ServerCore
    from streamrt.serve.listeners.grpc_service import start_grpc

    core = ServerCore(str(tmp_path), ServerConfig(grpc_server="h2corn"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen for gRPC on 127.0.0.1:{port}: the port is already"):
            asyncio.run(start_grpc(core, "127.0.0.1", port))


def test_the_server_answers_after_a_client_goes_away_mid_stream(server: ServerThread) -> None:
    """A stream the client abandons (cancelled) leaves the listener serving."""
    with grpclib.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        call = stream(iter([]), timeout=10)
        call.cancel()
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert client.is_server_ready() and client.is_model_ready("cnn")
    client.close()



@pytest.mark.parametrize("cut", [1, 3, 5, 7, 64, 10_000])
def test_frames_split_anywhere_give_the_same_messages(cut: int) -> None:
    """Messages whole in a chunk (views), spread over chunks (gathered), several in one chunk, a header cut in
    two: the same requests parse from them, and compressed ones decompress."""
    import gzip

    from streamrt.serve.listeners.grpc_h2corn import _Frames, frame
    from streamrt.serve.listeners.grpc_service import parse_infer_request
    from streamrt.serve.wire.proto import messages

    def request(i: int) -> bytes:
        m = messages.ModelInferRequest(model_name="m", id=str(i))
        m.inputs.add(name="x", datatype="FP32", shape=[3, 700])
        m.raw_input_contents.append(np.full((3, 700), i, np.float32).tobytes())
        return m.SerializeToString()

    def compressed(data: bytes) -> bytes:
        packed = gzip.compress(data)
        return b"\1" + len(packed).to_bytes(4, "big") + packed

    body = frame(request(0)) + frame(request(1)) + compressed(request(2))
    chunks = [body[i:i + cut] for i in range(0, len(body), cut)]

    async def read() -> list[Any]:
        events = iter([{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                       for i, c in enumerate(chunks)])

        async def receive() -> dict[str, Any]:
            return next(events)

        return [m async for m in _Frames(receive, 2**20, "gzip").messages()]

    got = asyncio.run(read())
    assert len(got) == 3
    for i, data in enumerate(got):
        parsed = parse_infer_request(data, 10**9)
        assert parsed.id == str(i) and np.array_equal(parsed.inputs["x"], np.full((3, 700), i, np.float32))


@pytest.mark.parametrize("case", ["one chunk", "split", "gzip", "two messages", "empty", "cut short", "over limit"])
def test_a_unary_request_is_exactly_one_message(case: str) -> None:
    """``_Frames.only``: the usual request (one uncompressed message, whole in one body event) is a view of
    the body; split or compressed ones take the general path with the same message; anything but exactly
    one message is INTERNAL, a message over the limit RESOURCE_EXHAUSTED."""
    import gzip

    from streamrt.serve.listeners.grpc_h2corn import _Frames, _Status, frame

    message = bytes(range(200))
    body = {"one chunk": frame(message), "split": frame(message), "two messages": frame(message) * 2,
            "gzip": b"\1" + len(gzip.compress(message)).to_bytes(4, "big") + gzip.compress(message),
            "empty": b"", "cut short": frame(message)[:-1], "over limit": frame(message)}[case]
    chunks = [body[:7], body[7:]] if case == "split" else [body]
    limit = 100 if case == "over limit" else 2**20

    async def read() -> Any:
        events = iter([{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                       for i, c in enumerate(chunks)])

        async def receive() -> dict[str, Any]:
            return next(events)

        return await _Frames(receive, limit, "gzip").only()

    if case in ("one chunk", "split", "gzip"):
        got = asyncio.run(read())
        assert bytes(got) == message
        if case == "one chunk":
            assert isinstance(got, memoryview) and got.obj is body  # a view of the body: no copy
        return
    with pytest.raises(_Status) as refused:
        asyncio.run(read())
    assert refused.value.code == (8 if case == "over limit" else 13)
