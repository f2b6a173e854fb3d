"""The sequence batcher through the real server and tritonclient (HTTP and gRPC): interleaved
sequences from several clients, each answer checked against a NumPy running sum of its sequence;
state released at END and after the idle timeout; direct and oldest strategies; control inputs;
Triton's refusals."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml

pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from streamrt.backends.base import Engine, ExecutionContext
from streamrt.errors import ConfigError, InferenceError
from streamrt.serve.configs.config import ModelConfig, ServerConfig
from streamrt.serve.configs.config_message import from_mapping
from streamrt.serve.models.model import load_engine
from streamrt.serve.scheduling.sequence import check_sequence_io
from streamrt.serve.server import ServerThread
from streamrt.testing.sequence_models import (
    accumulator,
    accumulator_config,
    controlled_accumulator,
    controlled_config,
)
from streamrt.types import DType, TensorSpec

pytestmark = pytest.mark.timeout(120)

WIDTH = 4
IDLE_US = 400_000
def _state_not_batched() -> onnx.ModelProto:
    """An accumulator whose STATE_OUT sums over the batch: one row whatever the batch size."""
    model = accumulator(WIDTH)
    graph = model.graph
    graph.node[1].CopyFrom(onnx.helper.make_node("ReduceSum", ["OUTPUT", "axes"], ["STATE_OUT"], keepdims=1))
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([0], np.int64), "axes"))
    return model


UNBATCHED_STATE = {"input_name": "STATE_IN", "output_name": "STATE_OUT", "data_type": "TYPE_FP32", "dims": [-1, WIDTH],
                   "initial_state": [{"data_type": "TYPE_FP32", "dims": [1, WIDTH], "zero_data": True}]}
MODELS: dict[str, tuple[onnx.ModelProto | None, dict[str, Any]]] = {
    # 2 instances x 4 slots
    "acc_direct": (accumulator(WIDTH), accumulator_config(WIDTH, instances=2)),
    # 2 candidate slots on 1 instance: a backlog forms; batches of 2 are preferred
    "acc_oldest": (accumulator(WIDTH), accumulator_config(WIDTH, strategy={"oldest": {
        "max_candidate_sequences": 2, "preferred_batch_size": [2], "max_queue_delay_microseconds": 20_000}})),
    "acc_idle": (accumulator(WIDTH), accumulator_config(WIDTH, max_batch_size=2, idle_us=IDLE_US)),
    "acc_controls": (controlled_accumulator(WIDTH), controlled_config(WIDTH)),
    # direct, 2 slots: a batch waits (up to WAIT_US) until both slots have a request
    "acc_wait": (accumulator(WIDTH), accumulator_config(WIDTH, max_batch_size=2, strategy={"direct": {
        "max_queue_delay_microseconds": 300_000, "minimum_slot_utilization": 1.0}})),
    # no batch dimension: one slot per instance, the state's dims are the whole tensor
    "acc_unbatched": (accumulator(WIDTH), {"max_batch_size": 0, "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
                                           "sequence_batching": {"state": [UNBATCHED_STATE]}}),
    # refused at load: its state output does not follow the batch
    "acc_bad_state": (_state_not_batched(), accumulator_config(WIDTH)),
    # an ensemble whose one step is the stateful acc_direct
    "acc_ensemble": (None, {"platform": "ensemble", "max_batch_size": 4,
                            "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
                            "output": [{"name": "SUM", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
                            "ensemble_scheduling": {"step": [{"model_name": "acc_direct", "model_version": -1,
                                                              "input_map": {"INPUT": "IN"},
                                                              "output_map": {"OUTPUT": "SUM"}}]}}),
    # the same graph without sequence_batching: a stateless model whose client sends the state
    "plain": (accumulator(WIDTH), {"max_batch_size": 4}),
}


ROWS: list[tuple[list[bool], list[int]]] = []
"""(READY column, CORRID column) of every execution of acc_controls, in order."""
FAIL_NEXT = threading.Event()
"""Set: the next execution of acc_controls fails (then it clears)."""
SLOW = {"acc_direct": 0.01}
"""Seconds each execution of these models takes longer, so that requests queue and share batches."""


class RecordingEngine(Engine):
    """The real engine; acc_controls writes each execution's READY and CORRID columns to
    :data:`ROWS`, the models in :data:`SLOW` take a little longer."""

    def __init__(self, inner: Engine, name: str) -> None:
        super().__init__(inner.manifest)
        self.inner, self.device_kind, self.name = inner, inner.device_kind, name

    def create_context(self) -> ExecutionContext:
        return RecordingContext(self)

    def close(self) -> None:
        self.inner.close()
        super().close()


class RecordingContext(ExecutionContext):
    engine: RecordingEngine

    def __init__(self, engine: RecordingEngine) -> None:
        super().__init__(engine)
        self.inner = engine.inner.create_context()

    def _infer_impl(self, inputs: Any, profile: int, stream: Any) -> dict[str, Any]:
        time.sleep(SLOW.get(self.engine.name, 0.0))
        if self.engine.name != "acc_controls":
            return self.inner.infer(inputs, stream)
        ROWS.append((np.asarray(inputs["READY"]).ravel().tolist(), np.asarray(inputs["CORRID"]).ravel().tolist()))
        if FAIL_NEXT.is_set():
            FAIL_NEXT.clear()
            raise InferenceError("injected engine failure")
        return self.inner.infer(inputs, stream)


def recording_loader(model_dir: Path, version: int, config: ModelConfig) -> Engine:
    engine = load_engine(model_dir, version, config)
    return RecordingEngine(engine, config.name) if config.name in ("acc_controls", *SLOW) else engine


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "2-frontend-processes"])
def server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    """The sequence models in one process and through two front-end worker processes (the
    sequence flags are parsed by the same listeners and cross the channel)."""
    repo = tmp_path_factory.mktemp("sequence_repo")
    for name, (model, config) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        if model is not None:  # an ensemble's version directory is empty
            onnx.save(model, str(repo / name / "1" / "model.onnx"))
        (repo / name / "config.yaml").write_text(yaml.safe_dump(config))
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5.0,
                          frontend_processes=request.param)
    with ServerThread(repo, config, engine_loader=recording_loader, start_timeout=120) as running:
        yield running




def _step(client: Any, model: str, x: np.ndarray, sequence_id: int | str, *, start: bool = False,
          end: bool = False) -> Any:
    """One request of a sequence through either client (tritonclient's sequence arguments)."""
    module = tgrpc if isinstance(client, tgrpc.InferenceServerClient) else thttp
    tensor = module.InferInput("INPUT", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)


def _client(server: ServerThread, protocol: str) -> Any:
    """A client of its own for one thread (tritonclient's HTTP client must stay on the thread that made it)."""
    if protocol == "http":
        return thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30, concurrency=4)
    return tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def _send(client: Any, model: str, x: np.ndarray, sequence_id: int | str, *, start: bool, end: bool) -> Any:
    """Send one request of a sequence without waiting; returns a function that waits for its result."""
    if isinstance(client, tgrpc.InferenceServerClient):
        tensor = tgrpc.InferInput("INPUT", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        done: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.async_infer(model, [tensor], callback=lambda result, error: done.put((result, error)),
                           sequence_id=sequence_id, sequence_start=start, sequence_end=end)

        def wait_grpc() -> Any:
            result, error = done.get(timeout=30)
            if error is not None:
                raise error
            return result

        return wait_grpc
    tensor = thttp.InferInput("INPUT", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    handle = client.async_infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return handle.get_result


def _drive(server: ServerThread, protocol: str, model: str, ids: list[int | str], steps: int, seed: int,
           failures: list[str]) -> None:
    """Run ``steps`` steps of each sequence of ``ids``: each step sends one request per sequence
    at once (so sequences share batches), then checks every answer against the running sum of
    that sequence's inputs (float64 reference). One request per sequence is in flight at a time."""
    rng = np.random.default_rng(seed)
    sums = {i: np.zeros((1, WIDTH)) for i in ids}
    client = _client(server, protocol)
    try:
        for k in range(steps):
            waiting = []
            for sequence_id in ids:
                x = rng.standard_normal((1, WIDTH)).astype(np.float32)
                sums[sequence_id] += x
                wait = _send(client, model, x, sequence_id, start=k == 0, end=k == steps - 1)
                waiting.append((sequence_id, sums[sequence_id].copy(), wait))
            for sequence_id, want, wait in waiting:
                got = wait().as_numpy("OUTPUT")
                if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
                    failures.append(f"{model} sequence {sequence_id} step {k}: {got} != {want}")
    except Exception as exc:  # reported by the test thread, not lost in this one
        failures.append(f"{model} sequences {ids}: {type(exc).__name__}: {exc}")
    finally:
        client.close()


def _run_clients(jobs: list[tuple[Any, ...]]) -> list[str]:
    failures: list[str] = []
    threads = [threading.Thread(target=_drive, args=(*job, failures)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads), "a client thread hung"
    return failures


def _stats(http: Any, model: str) -> dict[str, Any]:
    return http.get_inference_statistics(model)["model_stats"][0]  # type: ignore[no-any-return]


def test_interleaved_sequences_direct(server: ServerThread) -> None:
    """4 clients (2 HTTP, 2 gRPC) each interleave 2 sequences (integer and string ids) over the
    8 slots of 2 instances; each answer is its own sequence's running sum."""
    protocols = ["http", "http", "grpc", "grpc"]
    jobs = [(server, p, "acc_direct", [100 + 2 * i, f"seq-{i}"], 6, i) for i, p in enumerate(protocols)]
    failures = _run_clients(jobs)
    assert not failures, "\n".join(failures)
    http = _client(server, "http")
    try:
        sizes = [b["batch_size"] for b in _stats(http, "acc_direct")["batch_stats"]]
    finally:
        http.close()
    assert max(sizes) >= 2, sizes  # states of several sequences went through one batch


def test_unbatched_model_runs_one_sequence_per_instance(server: ServerThread) -> None:
    """max_batch_size 0: each instance has one slot; 3 sequences over 2 instances (one waits)."""
    failures = _run_clients([(server, p, "acc_unbatched", [500 + i], 4, 30 + i)
                             for i, p in enumerate(["http", "grpc", "http"])])
    assert not failures, "\n".join(failures)


def test_oldest_strategy_with_backlog(server: ServerThread, http: Any) -> None:
    """8 sequences from 4 clients through 2 candidate slots: the others wait in the backlog, each
    sequence still sees only its own state, in order."""
    before = _stats(http, "acc_oldest")["inference_count"]
    protocols = ["http", "http", "grpc", "grpc"]
    failures = _run_clients([(server, p, "acc_oldest", [1000 + i], 5, 10 + i) for i, p in enumerate(protocols)])
    failures += _run_clients([(server, p, "acc_oldest", [2000 + i], 5, 20 + i) for i, p in enumerate(protocols)])
    assert not failures, "\n".join(failures)
    stats = _stats(http, "acc_oldest")
    assert stats["inference_count"] - before == 8 * 5
    sizes = {b["batch_size"] for b in stats["batch_stats"]}
    assert sizes <= {1, 2} and 2 in sizes, sizes  # the two candidates share batches, never more rows than them


def test_direct_waits_for_minimum_slot_utilization(server: ServerThread, http: Any) -> None:
    """With minimum_slot_utilization 1.0 and a delay, two sequences' requests run as one batch at
    once, while one request alone waits for the delay before it runs."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(13)
    a, b = (rng.standard_normal((1, WIDTH)).astype(np.float32) for _ in range(2))

    def start(sequence_id: int, x: np.ndarray) -> float:
        client = _client(server, "grpc")
        try:
            began = time.perf_counter()
            assert np.allclose(_step(client, "acc_wait", x, sequence_id, start=True).as_numpy("OUTPUT"), x)
            return time.perf_counter() - began
        finally:
            client.close()

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(start, (1, 2), (a, b)))  # list: a failure in a thread is raised here
    assert [s["batch_size"] for s in _stats(http, "acc_wait")["batch_stats"]] == [2]
    began = time.perf_counter()
    assert np.allclose(_step(http, "acc_wait", b, 1, end=True).as_numpy("OUTPUT"), a + b, atol=1e-6)
    assert time.perf_counter() - began >= 0.25  # alone: it waited for the 0.3 s delay
    assert np.allclose(_step(http, "acc_wait", a, 2, end=True).as_numpy("OUTPUT"), a + b, atol=1e-6)


def test_control_inputs_per_row(server: ServerThread) -> None:
    """START/END/READY/CORRID reach each row as configured (FP32, INT32, BOOL, UINT64), while the
    READY-driven accumulator keeps each sequence's sum; empty slots get not-ready filler rows."""
    failures: list[str] = []

    def drive(protocol: str, sequence_id: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        total = np.zeros((1, WIDTH))
        client = _client(server, protocol)
        try:
            for k in range(5):
                x = rng.standard_normal((1, WIDTH)).astype(np.float32)
                total += x
                start, end = k == 0, k == 4
                result = _step(client, "acc_controls", x, sequence_id, start=start, end=end)
                flags = result.as_numpy("FLAGS").tolist()
                if flags != [[float(start), float(end), 1.0]]:
                    failures.append(f"sequence {sequence_id} step {k}: flags {flags}")
                if result.as_numpy("CORRID_OUT").tolist() != [[sequence_id]]:
                    failures.append(f"sequence {sequence_id} step {k}: CORRID {result.as_numpy('CORRID_OUT')}")
                if not np.allclose(result.as_numpy("OUTPUT"), total, rtol=1e-5, atol=1e-5):
                    failures.append(f"sequence {sequence_id} step {k}: sum {result.as_numpy('OUTPUT')} != {total}")
        except Exception as exc:
            failures.append(f"sequence {sequence_id}: {type(exc).__name__}: {exc}")
        finally:
            client.close()

    threads = [threading.Thread(target=drive, args=(p, 2**40 + i, i)) for i, p in enumerate(["http", "grpc", "http"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a client thread hung"
    assert not failures, "\n".join(failures)


def test_direct_rows_keep_their_slot_positions(http: Any) -> None:
    """Direct strategy with a READY control: a row is its sequence's slot; empty slots below the
    last used one run as not-ready fillers (CORRID 0), and they leave every state alone."""
    rng = np.random.default_rng(11)
    xs = {i: rng.standard_normal((1, WIDTH)).astype(np.float32) for i in (31, 32, 33)}
    for sequence_id, x in xs.items():  # bound to free slots in START order: 33 is not in slot 0
        _step(http, "acc_controls", x, sequence_id, start=True)
    ROWS.clear()
    y = rng.standard_normal((1, WIDTH)).astype(np.float32)
    assert np.allclose(_step(http, "acc_controls", y, 33).as_numpy("OUTPUT"), xs[33] + y, atol=1e-6)
    (ready, corrid), = ROWS
    assert len(ready) >= 3 and ready == [False] * (len(ready) - 1) + [True]
    assert corrid == [0] * (len(ready) - 1) + [33]
    for sequence_id, x in xs.items():  # the fillers did not touch the states of 31 and 32
        expected = x + y if sequence_id == 33 else x
        got = _step(http, "acc_controls", np.zeros_like(x), sequence_id, end=True).as_numpy("OUTPUT")
        assert np.allclose(got, expected, atol=1e-6)


def test_grpc_stream_carries_interleaved_sequences(server: ServerThread) -> None:
    """Triton's sequence examples stream: two sequences interleaved on one ModelStreamInfer
    stream, each response its own sequence's running sum, in the order sent."""
    client = _client(server, "grpc")
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    rng = np.random.default_rng(12)
    expected = []
    sums = {"left": np.zeros((1, WIDTH)), 9001: np.zeros((1, WIDTH))}
    try:
        for k in range(4):
            for sequence_id in sums:
                x = rng.standard_normal((1, WIDTH)).astype(np.float32)
                sums[sequence_id] += x
                expected.append(sums[sequence_id].copy())
                tensor = tgrpc.InferInput("INPUT", [1, WIDTH], "FP32")
                tensor.set_data_from_numpy(x)
                client.async_stream_infer("acc_direct", [tensor], sequence_id=sequence_id, sequence_start=k == 0,
                                          sequence_end=k == 3)
        for want in expected:
            result, error = results.get(timeout=30)
            assert error is None, error
            assert np.allclose(result.as_numpy("OUTPUT"), want, atol=1e-5)
    finally:
        client.stop_stream()
        client.close()


def test_failed_step_leaves_the_state(http: Any, grpc: Any) -> None:
    """An engine failure reaches only the requests of that batch (500); the sequence keeps the
    state it had before the failed step and goes on."""
    rng = np.random.default_rng(14)
    x, y, z = (rng.standard_normal((1, WIDTH)).astype(np.float32) for _ in range(3))
    _step(http, "acc_controls", x, 61, start=True)
    FAIL_NEXT.set()
    with pytest.raises(InferenceServerException, match="injected engine failure") as failed:
        _step(http, "acc_controls", y, 61)
    assert failed.value.status() == "500"
    assert np.allclose(_step(grpc, "acc_controls", z, 61, end=True).as_numpy("OUTPUT"), x + z, atol=1e-6)


def test_sequence_through_an_ensemble(http: Any) -> None:
    """An ensemble hands the request's sequence to its stateful step."""
    rng = np.random.default_rng(15)
    xs = [rng.standard_normal((1, WIDTH)).astype(np.float32) for _ in range(3)]
    total = np.zeros((1, WIDTH))
    for k, x in enumerate(xs):
        total += x
        tensor = thttp.InferInput("IN", [1, WIDTH], "FP32")
        tensor.set_data_from_numpy(x)
        result = http.infer("acc_ensemble", [tensor], sequence_id="through-ensemble", sequence_start=k == 0,
                            sequence_end=k == 2)
        assert np.allclose(result.as_numpy("SUM"), total, atol=1e-5)


def test_end_releases_the_state(http: Any, grpc: Any) -> None:
    """After END the id is unknown again; a new START begins from zero, not from the old sum."""
    rng = np.random.default_rng(7)
    a, b, c = (rng.standard_normal((1, WIDTH)).astype(np.float32) for _ in range(3))
    _step(http, "acc_direct", a, 77, start=True)
    assert np.allclose(_step(grpc, "acc_direct", b, 77, end=True).as_numpy("OUTPUT"), a + b, atol=1e-6)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _step(http, "acc_direct", c, 77)
    assert np.allclose(_step(http, "acc_direct", c, 77, start=True, end=True).as_numpy("OUTPUT"), c, atol=1e-6)


def test_start_again_restarts_a_live_sequence(http: Any) -> None:
    rng = np.random.default_rng(8)
    a, b = (rng.standard_normal((1, WIDTH)).astype(np.float32) for _ in range(2))
    _step(http, "acc_direct", a, "restart", start=True)
    assert np.allclose(_step(http, "acc_direct", b, "restart", start=True).as_numpy("OUTPUT"), b, atol=1e-6)
    assert np.allclose(_step(http, "acc_direct", a, "restart", end=True).as_numpy("OUTPUT"), a + b, atol=1e-6)


def test_idle_sequence_expires(http: Any, grpc: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A sequence idle for max_sequence_idle_microseconds loses its slot and state (logged); one
    that keeps sending inside that time keeps both."""
    rng = np.random.default_rng(9)
    a, b, c = (rng.standard_normal((1, WIDTH)).astype(np.float32) for _ in range(3))
    caplog.set_level(logging.INFO, logger="streamrt.serve.scheduling.sequence")
    _step(http, "acc_idle", a, 5, start=True)
    _step(grpc, "acc_idle", a, 6, start=True)
    for _ in range(3):  # sequence 6 stays active, each gap well under the idle time
        time.sleep(IDLE_US / 1e6 / 4)
        _step(grpc, "acc_idle", np.zeros_like(a), 6)
    time.sleep(IDLE_US / 1e6 * 1.5)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _step(http, "acc_idle", b, 5)
    assert "sequence 5 was idle" in caplog.text
    assert np.allclose(_step(http, "acc_idle", c, 5, start=True, end=True).as_numpy("OUTPUT"), c, atol=1e-6)
    # sequence 6 idled out too by now; the 2 slots of the model are free for new sequences
    for sequence_id in (7, 8):
        assert np.allclose(_step(http, "acc_idle", b, sequence_id, start=True, end=True).as_numpy("OUTPUT"), b)


def test_refusals(http: Any, grpc: Any) -> None:
    x = np.ones((1, WIDTH), np.float32)
    with pytest.raises(InferenceServerException, match="sequence 4242 to model 'acc_direct' must specify the START"):
        _step(http, "acc_direct", x, 4242)
    with pytest.raises(InferenceServerException, match="must specify the START flag") as grpc_error:
        _step(grpc, "acc_direct", x, "never-started")
    assert grpc_error.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="must specify a non-zero or non-empty correlation ID"):
        tensor = thttp.InferInput("INPUT", [1, WIDTH], "FP32")
        tensor.set_data_from_numpy(x)
        http.infer("acc_direct", [tensor])
    with pytest.raises(InferenceServerException, match="batch-size 1"):
        _step(http, "acc_direct", np.ones((2, WIDTH), np.float32), 1, start=True)
    with pytest.raises(InferenceServerException, match="integer sequence ids"):
        _step(grpc, "acc_controls", x, "text-id", start=True)
    state = thttp.InferInput("STATE_IN", [1, WIDTH], "FP32")
    state.set_data_from_numpy(x)
    tensor = thttp.InferInput("INPUT", [1, WIDTH], "FP32")
    tensor.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match="has no sequence_batching") as plain:
        http.infer("plain", [tensor, state], sequence_id=3, sequence_start=True)
    assert plain.value.status() == "400"
    assert np.allclose(http.infer("plain", [tensor, state]).as_numpy("OUTPUT"), 2 * x)  # without: served


@pytest.mark.parametrize(("parameters", "message"), [
    ({"sequence_id": -1}, "must be in 0..2**64-1"),
    ({"sequence_id": 1.5}, "unsigned integer or a string"),
    ({"sequence_id": "x" * 129}, "at most 128"),
    ({"sequence_id": 3, "sequence_start": "yes"}, "'sequence_start' must be a boolean"),
    ({"sequence_end": True}, "need a non-zero or non-empty sequence_id"),
])
def test_bad_sequence_parameters_over_raw_http(server: ServerThread, parameters: dict[str, Any],
                                              message: str) -> None:
    body = json.dumps({"parameters": parameters, "inputs": [
        {"name": "INPUT", "shape": [1, WIDTH], "datatype": "FP32", "data": [0.0] * WIDTH}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v2/models/acc_direct/infer", body,
                                     {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=10)
    assert error.value.code == 400
    assert message in json.loads(error.value.read())["error"]


def test_state_output_that_ignores_the_batch_is_refused(http: Any) -> None:
    """The load-time batch probe covers state outputs: a state that would hand one sequence the
    rows of others refuses the model."""
    entry = next(e for e in http.get_model_repository_index() if e["name"] == "acc_bad_state")
    assert entry["state"] == "UNAVAILABLE" and "STATE_OUT" in entry["reason"], entry


def test_config_and_metadata(http: Any, grpc: Any) -> None:
    """The batcher's inputs and outputs are not the client's; the config reply shows the batcher."""
    meta = http.get_model_metadata("acc_controls")
    assert [t["name"] for t in meta["inputs"]] == ["INPUT"]
    assert [t["name"] for t in meta["outputs"]] == ["OUTPUT", "FLAGS", "CORRID_OUT"]
    config = http.get_model_config("acc_controls")["sequence_batching"]
    assert [c["name"] for c in config["control_input"]] == ["START", "END", "READY", "CORRID"]
    assert config["control_input"][3]["control"][0]["data_type"] == "TYPE_UINT64"
    assert config["state"][0]["input_name"] == "STATE_IN" and config["state"][0]["dims"] == [WIDTH]
    assert config["max_sequence_idle_microseconds"] == 1_000_000  # Triton's default
    oldest = grpc.get_model_config("acc_oldest", as_json=True)["config"]["sequence_batching"]["oldest"]
    assert oldest["max_candidate_sequences"] == 2 and oldest["preferred_batch_size"] == [2]
    assert "sequence" in http.get_server_metadata()["extensions"]


# --- config checks without a server -------------------------------------------------------------------


def _state_config(**changes: Any) -> dict[str, Any]:
    base = accumulator_config(WIDTH)
    base["sequence_batching"]["state"][0].update(changes)
    return base


def test_engine_must_have_the_controls_and_states() -> None:
    specs_in = [TensorSpec("INPUT", DType.FLOAT32, (-1, WIDTH)), TensorSpec("STATE_IN", DType.FLOAT32, (-1, WIDTH))]
    specs_out = [TensorSpec("OUTPUT", DType.FLOAT32, (-1, WIDTH)), TensorSpec("STATE_OUT", DType.FLOAT32, (-1, WIDTH))]
    check_sequence_io(from_mapping(accumulator_config(WIDTH), "m"), specs_in, specs_out)
    with pytest.raises(ConfigError, match="state input 'S' is not in the engine"):
        check_sequence_io(from_mapping(_state_config(input_name="S"), "m"), specs_in, specs_out)
    with pytest.raises(ConfigError, match="state output 'STATE_OUT' is TYPE_FP32 in the config but TYPE_FP16"):
        check_sequence_io(from_mapping(accumulator_config(WIDTH), "m"), specs_in,
                          [specs_out[0], TensorSpec("STATE_OUT", DType.FLOAT16, (-1, WIDTH))])
    with pytest.raises(ConfigError, match="has dims \\[5\\] in the config but \\[4\\]"):
        cfg = _state_config(dims=[5], initial_state=[{"data_type": "TYPE_FP32", "dims": [5], "zero_data": True}])
        check_sequence_io(from_mapping(cfg, "m"), specs_in, specs_out)
    controlled = from_mapping(controlled_config(WIDTH), "m")
    with pytest.raises(ConfigError, match="control input 'START' is not in the engine"):
        check_sequence_io(controlled, specs_in, specs_out)


@pytest.mark.parametrize(("change", "message"), [
    ({"control_input": [{"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_START"}]}]},
     "needs exactly one of int32_false_true"),
    ({"control_input": [{"name": "C", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_FP32"}]}]},
     "CORRID needs data_type TYPE_INT32"),
    ({"control_input": [{"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]},
                        {"name": "T", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]}]},
     "given twice"),
    ({"iterative_sequence": True}, "iterative sequences"),
    ({"oldest": {"max_candidate_sequences": -1}}, "max_candidate_sequences must be an integer >= 0"),
    ({"direct": {"minimum_slot_utilization": 1.5}}, "minimum_slot_utilization must be in 0..1"),
])
def test_config_errors(change: dict[str, Any], message: str) -> None:
    config: dict[str, Any] = {"max_batch_size": 4, "sequence_batching": change}
    with pytest.raises(ConfigError, match=message):
        from_mapping(config, "m")


def test_state_with_variable_dims_needs_initial_dims(tmp_path: Path) -> None:
    cfg = _state_config(dims=[-1], initial_state=[])
    with pytest.raises(ConfigError, match="variable size; give initial_state"):
        from_mapping(cfg, "m")
    cfg = _state_config(dims=[-1])
    assert from_mapping(cfg, "m").sequence_batching.states[0].start_dims == (WIDTH,)  # type: ignore[union-attr]
