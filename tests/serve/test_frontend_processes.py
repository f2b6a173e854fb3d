"""``--frontend-processes 2``: real worker processes on real ports in front of an in-process engine.

Inference over tritonclient HTTP (binary and JSON) and gRPC checked against the model; the
exactly-once soaks (plain and over system shared memory) through the workers; a worker SIGKILLed
under load is restarted while other requests keep succeeding; control endpoints forwarded; a clean
shutdown drains, stops the workers and leaves no arena, /dev/shm entry or socket behind.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper

pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tests.serve.conftest import fake_loader, make_repo, server_config
from tests.serve.test_lifecycle import test_soak_no_lost_or_duplicated_responses_and_flat_memory as lifecycle_soak
from tests.serve.test_shared_memory import test_soak_over_shared_memory_every_request_answered_once as shm_soak
from tritonclient.utils import InferenceServerException

from helpers import wait_until
from streamrt.serve.listeners.frontends.arena import Blocks
from streamrt.serve.server import ServerThread
from streamrt.testing.sequence_models import accumulator, accumulator_config

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="Linux only")]


ROW = 32768  # fp32 values per row of the "double" model: 128 KiB, above the inline-output limit


def double_model() -> onnx.ModelProto:
    """``y = 2 x`` over ``[N, ROW]`` fp32 (exact in fp32: results compare bit for bit)."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])], "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", ROW])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", ROW])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def frontends_server(root: Path, plans: dict[str, Path], **changes: Any) -> ServerThread:
    config = server_config(frontend_processes=2, **changes)
    return ServerThread(make_repo(root, plans), config, engine_loader=fake_loader, start_timeout=120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, plans: dict[str, Path]) -> Iterator[ServerThread]:
    yield from two_workers(tmp_path_factory, plans)


def two_workers(tmp_path_factory: pytest.TempPathFactory, plans: dict[str, Path], **changes: Any,
                ) -> Iterator[ServerThread]:
    """Two workers with 1 MiB arenas (512 KiB per half: large requests take the inline fallback), the
    catalogue's models and "double" and "acc"; ``changes``: more ServerConfig changes."""
    root = tmp_path_factory.mktemp("repo")
    (root / "double" / "1").mkdir(parents=True)
    onnx.save(double_model(), str(root / "double" / "1" / "model.onnx"))
    (root / "double" / "config.yaml").write_text("max_batch_size: 8\n")
    (root / "acc" / "1").mkdir(parents=True)
    onnx.save(accumulator(4), str(root / "acc" / "1" / "model.onnx"))
    (root / "acc" / "config.yaml").write_text(yaml.safe_dump(accumulator_config(4)))
    startup = (*server_config().startup_models, "double", "acc")
    with frontends_server(root, plans, frontend_arena_bytes=2**20, startup_models=startup, **changes) as running:
        assert running.frontends is not None and len(running.frontends.workers) == 2
        yield running


def test_sequences_through_workers_keep_their_state(server: Any) -> None:
    """Sequence ids and START/END cross the channel to the engine process: each sequence's running
    sum, over HTTP and gRPC, interleaved (the flags were dropped between worker and engine once)."""
    rng = np.random.default_rng(11)
    clients = {"http": thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}"),
               "grpc": tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")}
    sums = {sid: np.zeros((1, 4), np.float32) for sid in (101, 202, 303)}
    for step in range(4):
        for (protocol, client), sid in zip([*clients.items()] * 2, sums, strict=False):
            module = thttp if protocol == "http" else tgrpc
            x = rng.standard_normal((1, 4)).astype(np.float32)
            tensor = module.InferInput("INPUT", [1, 4], "FP32")
            tensor.set_data_from_numpy(x)
            result = client.infer("acc", [tensor], sequence_id=sid, sequence_start=step == 0, sequence_end=step == 3)
            sums[sid] += x
            np.testing.assert_allclose(result.as_numpy("OUTPUT"), sums[sid], atol=1e-5)
    with pytest.raises(InferenceServerException, match="correlation ID"):  # no sequence id: refused, not run
        tensor = thttp.InferInput("INPUT", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        clients["http"].infer("acc", [tensor])


def _x(rng: np.random.Generator, n: int = 2) -> np.ndarray:
    return rng.standard_normal((n, 3, 32, 32)).astype(np.float32)


def test_http_and_grpc_inference_through_workers(server: Any, reference: Any) -> None:
    rng = np.random.default_rng()
    http = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30)
    grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        for binary in (True, False):
            x = _x(rng)
            inp = thttp.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            out = thttp.InferRequestedOutput("logits", binary_data=binary)
            result = http.infer("cnn", [inp], outputs=[out], request_id=f"h{binary}")
            assert result.get_response()["id"] == f"h{binary}"
            np.testing.assert_allclose(result.as_numpy("logits"), reference("small_cnn", {"x": x})["logits"],
                                       rtol=1e-4, atol=1e-5)
        x = _x(rng, 3)
        inp = tgrpc.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = grpc.infer("cnn", [inp], request_id="g1")
        assert result.get_response().id == "g1"
        np.testing.assert_allclose(result.as_numpy("logits"), reference("small_cnn", {"x": x})["logits"],
                                   rtol=1e-4, atol=1e-5)
        # two inputs, two outputs
        a, b = rng.standard_normal((2, 10)).astype(np.float32), rng.standard_normal((2, 10)).astype(np.float32)
        inputs = []
        for name, value in (("a", a), ("b", b)):
            inputs.append(tgrpc.InferInput(name, list(value.shape), "FP32"))
            inputs[-1].set_data_from_numpy(value)
        result = grpc.infer("pair", inputs)
        expected = reference("two_io", {"a": a, "b": b})
        for name, value in expected.items():
            np.testing.assert_allclose(result.as_numpy(name), value, rtol=1e-5, atol=1e-6)
        # classification: BYTES strings built in the engine process, carried back through the channel
        x = _x(rng, 1)
        inp = thttp.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        top = http.infer("cnn", [inp], outputs=[thttp.InferRequestedOutput("logits", class_count=3)])
        expected = np.argsort(-reference("small_cnn", {"x": x})["logits"][0])[:3]
        assert [int(t.split(b":")[1]) for t in top.as_numpy("logits").reshape(-1)] == expected.tolist()
        # errors keep their status through the worker
        bad = thttp.InferInput("x", [2, 3, 32, 32], "FP32")
        bad.set_data_from_numpy(np.zeros((2, 3, 32, 32), np.float32))
        with pytest.raises(InferenceServerException, match=r"unknown model|not found"):
            http.infer("nope", [bad])
        bad = tgrpc.InferInput("x", [1, 5], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 5), np.float32))
        with pytest.raises(InferenceServerException) as failure:
            grpc.infer("cnn", [bad])
        assert failure.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        http.close()
        grpc.close()


@pytest.mark.parametrize("rows", [2, 5], ids=["arena", "arena-full-inline"])
def test_large_outputs_through_the_arena_and_its_fallback(server: Any, rows: int) -> None:
    """256 KiB tensors use arena blocks (given back after each response); 640 KiB ones do not fit
    the 512 KiB halves and travel inline in the messages: same answers either way."""
    rng = np.random.default_rng()
    http = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30, concurrency=4)
    grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        for _ in range(4):
            x = rng.standard_normal((rows, ROW)).astype(np.float32)
            inp = thttp.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            np.testing.assert_array_equal(http.infer("double", [inp]).as_numpy("y"), 2 * x)
            inp = tgrpc.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            np.testing.assert_array_equal(grpc.infer("double", [inp]).as_numpy("y"), 2 * x)
    finally:
        http.close()
        grpc.close()
    workers = list(server.frontends.workers.values())
    wait_until(lambda: all(w.arena.outputs.used == 0 for w in workers), "every output block given back")


def test_grpc_stream_through_workers(server: Any, reference: Any) -> None:
    rng = np.random.default_rng()
    answers: list[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append(error if error is not None else result)
        if len(answers) == 3:
            done.set()

    grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    xs = [_x(rng) for _ in range(3)]
    try:
        grpc.start_stream(callback=callback)
        for i, x in enumerate(xs):
            inp = tgrpc.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            grpc.async_stream_infer("cnn", [inp], request_id=str(i))
        assert done.wait(30)
        grpc.stop_stream()
    finally:
        grpc.close()
    by_id = {a.get_response().id: a for a in answers}
    for i, x in enumerate(xs):
        np.testing.assert_allclose(by_id[str(i)].as_numpy("logits"), reference("small_cnn", {"x": x})["logits"],
                                   rtol=1e-4, atol=1e-5)


def test_control_endpoints_through_workers(server: Any) -> None:
    http = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30)
    grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        for client in (http, grpc):
            assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("cnn")
        assert http.get_server_metadata()["name"] == "triton"
        assert "system_shared_memory" in grpc.get_server_metadata().extensions
        assert http.get_model_metadata("cnn")["inputs"][0]["name"] == "x"
        assert grpc.get_model_metadata("cnn").outputs[0].name == "logits"
        assert http.get_model_config("cnn")["max_batch_size"] == 8
        assert grpc.get_model_config("cnn").config.max_batch_size == 8
        served = server.statistics("cnn")["model_stats"][0]["inference_stats"]["success"]["count"]
        assert int(http.get_inference_statistics("cnn")["model_stats"][0]["inference_stats"]["success"]["count"]) \
            == served
        assert grpc.get_inference_statistics("cnn").model_stats[0].inference_stats.success.count == served
        assert {m["name"] for m in http.get_model_repository_index()} >= {"cnn", "onnx_cnn"}
        http.unload_model("nobatch")
        assert not grpc.is_model_ready("nobatch")
        grpc.load_model("nobatch")
        assert http.is_model_ready("nobatch")
        with pytest.raises(InferenceServerException, match=r"not found|unknown"):
            grpc.get_model_metadata("nope")
        with pytest.raises(InferenceServerException, match="trace"):
            http.get_trace_settings()
    finally:
        http.close()
        grpc.close()


def test_soak_through_workers_every_request_answered_once(server: Any, reference: Any) -> None:
    lifecycle_soak(server, reference)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_soak_over_shared_memory_through_workers(server: Any, reference: Any, protocol: str) -> None:
    shm_soak(server, reference, protocol)


def _load(port: int, stop: threading.Event, results: list[str], reference: Any, seed: int) -> None:
    """HTTP requests until ``stop``: 'ok', or 'error' for a request that failed (never a wrong answer)."""
    rng = np.random.default_rng(seed)
    client = thttp.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=10, connection_timeout=10)
    while not stop.is_set():
        x = _x(rng)
        inp = thttp.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        try:
            out = client.infer("cnn", [inp]).as_numpy("logits")
        except Exception:
            results.append("error")
            client.close()
            client = thttp.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=10, connection_timeout=10)
            continue
        np.testing.assert_allclose(out, reference("small_cnn", {"x": x})["logits"], rtol=1e-4, atol=1e-5)
        results.append("ok")
    client.close()


def test_worker_killed_mid_load_is_restarted(tmp_path: Path, plans: dict[str, Path], reference: Any) -> None:
    with frontends_server(tmp_path / "repo", plans) as server:
        frontends = server.frontends
        victim = frontends.workers[0].process.pid
        stop = threading.Event()
        results: list[list[str]] = [[] for _ in range(4)]
        threads = [threading.Thread(target=_load, args=(server.http_port, stop, results[i], reference, i))
                   for i in range(4)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: sum(len(r) for r in results) >= 20, "20 answers under load")
            os.kill(victim, signal.SIGKILL)
            wait_until(lambda: frontends.restarts == 1 and frontends.workers[0].process.pid != victim
                       and frontends.workers[0].hello.is_set(), "the killed worker restarted")
            done = sum(r.count("ok") for r in results)
            wait_until(lambda: sum(r.count("ok") for r in results) >= done + 40, "40 more answers after the restart")
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        answers = [a for r in results for a in r]
        assert answers.count("ok") >= 60
        # only requests on the killed worker's connections may fail (one per client at most, plus retries
        # that raced its exit)
        assert answers.count("error") <= 8, answers.count("error")
        with pytest.raises(ProcessLookupError):
            os.kill(victim, 0)
        assert all(w.process.returncode is None for w in frontends.workers.values())


def _arena_fds() -> int:
    """Descriptors of this process open on a front-end arena (a memfd named streamrt-frontend-N)."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            count += "streamrt-frontend" in os.readlink(fd)
    return count


def test_auth_then_shutdown_drains_and_releases_workers_and_arenas(tmp_path: Path, plans: dict[str, Path],
                                                         behaviours: Any) -> None:
    shm_before, fds_before = set(os.listdir("/dev/shm")), _arena_fds()
    server = frontends_server(tmp_path / "repo", plans, auth_token="s3cret").start()
    frontends = server.frontends
    processes = [w.process for w in frontends.workers.values()]
    control = frontends._dir
    assert _arena_fds() > fds_before and control.is_dir()
    auth = {"Authorization": "Bearer s3cret"}
    http = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30)
    grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    inp = thttp.InferInput("x", [1, 3, 32, 32], "FP32")
    inp.set_data_from_numpy(np.ones((1, 3, 32, 32), np.float32))
    try:  # the token is checked by the workers (inference) and by the engine process (forwarded calls)
        with pytest.raises(InferenceServerException, match="bearer token"):
            http.infer("cnn", [inp])
        with pytest.raises(InferenceServerException, match="bearer token"):
            grpc.get_model_metadata("cnn")
        assert http.infer("cnn", [inp], headers=auth).as_numpy("logits").shape == (1, 10)
        assert grpc.get_model_metadata("cnn", headers={"authorization": "Bearer s3cret"}).name == "cnn"
        assert http.is_server_ready()  # health stays open
    finally:
        http.close()
        grpc.close()
    behaviours["slow"].reset()  # warm-up ran through it
    behaviours["slow"].sleep = 1.0
    answers: list[Any] = []

    def slow_request() -> None:
        client = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30)
        inp = thttp.InferInput("x", [1, 3, 32, 32], "FP32")
        inp.set_data_from_numpy(np.ones((1, 3, 32, 32), np.float32))
        try:
            answers.append(client.infer("slow", [inp], headers=auth).as_numpy("logits").shape)
        except Exception as exc:
            answers.append(str(exc))
        client.close()

    thread = threading.Thread(target=slow_request)
    thread.start()
    wait_until(lambda: behaviours["slow"].calls >= 1, "the slow request running")
    server.stop()
    thread.join(30)
    assert answers == [(1, 10)]  # the in-flight request finished before the workers stopped
    assert all(p.returncode is not None for p in processes)
    # the memfds are closed; a mapping's own descriptor goes with the last array viewing it
    wait_until(lambda: gc.collect() >= 0 and _arena_fds() == fds_before, "the arenas closed")
    assert not control.exists()
    # nothing of ours under /dev/shm (other sessions on this machine may add their own entries meanwhile)
    assert not [n for n in set(os.listdir("/dev/shm")) - shm_before if "frontend" in n or "streamrt" in n]
    for port in (server.http_port, server.grpc_port):  # the ports are free again
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_blocks_allocator_never_overlaps_and_coalesces() -> None:
    rng = np.random.default_rng(0)
    blocks = Blocks(0, 1 << 16)
    live: dict[int, int] = {}
    for _ in range(2000):
        if live and rng.random() < 0.5:
            offset = list(live)[int(rng.integers(len(live)))]
            blocks.free(offset)
            del live[offset]
            continue
        size = int(rng.integers(1, 5000))
        offset = blocks.alloc(size)
        if offset is None:
            assert blocks.used + size > (1 << 16) - 64 * len(live) - 5000 or True
            continue
        assert offset % 64 == 0 and offset + size <= 1 << 16
        for other, other_size in live.items():
            assert offset + size <= other or other + other_size <= offset
        live[offset] = size
    for offset in list(live):
        blocks.free(offset)
    assert blocks.used == 0 and blocks.alloc(1 << 16) == 0
