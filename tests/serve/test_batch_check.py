"""Issue 18, the per-batch check: an engine that turns bad *after* loading (passes the load probe)
gets every request of each bad batch a clear 500 / INTERNAL naming model, output and shapes, counted
as a BACKEND failure; with the check removed the same engine hands clients foreign or empty rows."""

from __future__ import annotations

import queue
import re
import threading
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml

import streamrt
from streamrt.backends.base import Engine, ExecutionContext
from streamrt.errors import OutputMismatchError
from streamrt.serve import ServerConfig, ServerThread
from streamrt.serve.configs.config import ModelConfig, TensorConfig
from streamrt.serve.execution.integrity import OutputCheck, batch_refusal, probe_batch_outputs, probe_sizes
from streamrt.serve.models.model import load_engine
from streamrt.testing.batch_models import mixed_dtype_inputs, mixed_dtype_model, mixed_dtype_profiles
from streamrt.types import DType

pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc")

import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.timeout(180)

OUTPUTS = ("scaled", "rowsum", "half", "flag")
DTYPES = {"a": "FP32", "b": "INT32", "c": "FP16"}


class Turn:
    """How the misbehaving engine corrupts its outputs once loading is over (None: it does not)."""

    mode: str | None = None
    lock = threading.Lock()


class TurningEngine(Engine):
    """A real engine whose context corrupts ``scaled`` on demand, the ways a buggy model would."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner.manifest)
        self.inner, self.device_kind = inner, inner.device_kind

    def create_context(self) -> ExecutionContext:
        return TurningContext(self)

    def close(self) -> None:
        self.inner.close()
        super().close()


class TurningContext(ExecutionContext):
    engine: TurningEngine

    def __init__(self, engine: TurningEngine) -> None:
        super().__init__(engine)
        self.inner = engine.inner.create_context()

    def _infer_impl(self, inputs: Mapping[str, Any], profile: int, stream: Any) -> dict[str, Any]:
        out = self.inner.infer(inputs, stream)
        mode = Turn.mode
        if mode == "reduce":      # the batch collapses to one row: a mean over every request's rows
            out["scaled"] = out["scaled"].mean(axis=0, keepdims=True)
        elif mode == "dtype":
            out["scaled"] = out["scaled"].astype(np.float64)
        elif mode == "dims":
            out["scaled"] = np.concatenate([out["scaled"], out["scaled"][:, :1]], axis=1)
        return out


def turning_loader(model_dir: Path, version: int, config: ModelConfig) -> Engine:
    return TurningEngine(load_engine(model_dir, version, config))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    folder = tmp_path_factory.mktemp("mixed")
    onnx.save(mixed_dtype_model(), str(folder / "m.onnx"))
    build = streamrt.BuildConfig(profiles=mixed_dtype_profiles(), backend_options={"threads": 1})
    plan = streamrt.build(folder / "m.onnx", build, folder / "m.plan", cache_dir=folder / "cache").path
    repo = folder / "repo"
    (repo / "turning" / "1").mkdir(parents=True)
    (repo / "turning" / "1" / "model.plan").write_bytes(plan.read_bytes())
    (repo / "turning" / "config.yaml").write_text(yaml.safe_dump({
        "max_batch_size": 16, "instance_group": [{"count": 2}],
        "dynamic_batching": {"max_queue_delay_microseconds": 50_000, "preferred_batch_size": [16]}}))
    Turn.mode = None
    cfg = ServerConfig(http_port=0, grpc_port=0, metrics_port=0, exit_timeout_s=5.0)
    with ServerThread(repo, cfg, engine_loader=turning_loader, start_timeout=120) as running:
        yield running
    Turn.mode = None


@pytest.fixture
def turn() -> Iterator[type[Turn]]:
    with Turn.lock:
        yield Turn
        Turn.mode = None


def _http_inputs(x: dict[str, np.ndarray]) -> list[Any]:
    items = []
    for name, value in x.items():
        inp = thttp.InferInput(name, list(value.shape), DTYPES[name])
        inp.set_data_from_numpy(value)
        items.append(inp)
    return items


def _grpc_inputs(x: dict[str, np.ndarray]) -> list[Any]:
    items = []
    for name, value in x.items():
        inp = tgrpc.InferInput(name, list(value.shape), DTYPES[name])
        inp.set_data_from_numpy(value)
        items.append(inp)
    return items


def fan_out(server: ServerThread, protocol: str, requests: list[dict[str, np.ndarray]]) -> list[Any]:
    """Send every request at once; each answer is an output dict or the client's exception."""
    if protocol == "http":
        client = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}", concurrency=len(requests),
                                             network_timeout=60)
        try:
            handles = [client.async_infer("turning", _http_inputs(x)) for x in requests]
            answers: list[Any] = []
            for handle in handles:
                try:
                    result = handle.get_result()
                    answers.append({n: result.as_numpy(n) for n in OUTPUTS})
                except InferenceServerException as exc:
                    answers.append(exc)
            return answers
        finally:
            client.close()
    grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    boxes: list[queue.Queue[Any]] = [queue.Queue() for _ in requests]
    try:
        for x, box in zip(requests, boxes, strict=True):
            grpc.async_infer("turning", _grpc_inputs(x),
                             callback=lambda result, error, box=box: box.put(error or result))
        raw = [box.get(timeout=60) for box in boxes]
        return [a if isinstance(a, BaseException) else {n: a.as_numpy(n) for n in OUTPUTS} for a in raw]
    finally:
        grpc.close()


def _failures(server: ServerThread) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    match = re.search(r'^nv_inference_request_failure\{model="turning",version="1",reason="BACKEND"\} (\S+)$',
                      text, re.M)
    assert match, "no BACKEND failure series for model 'turning'"
    return float(match.group(1))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("mode", "words"), [
    ("reduce", ["output 'scaled'", "for a batch of", "rows; its first dimension must be"]),
    ("dtype", ["output 'scaled'", "float64", "TYPE_FP32"]),
    ("dims", ["output 'scaled'", ", 5] but the config says [", ", 4]"]),
])
def test_bad_batch_fails_every_request_with_500_naming_model_output_and_shapes(
    server: ServerThread, turn: type[Turn], protocol: str, mode: str, words: list[str]
) -> None:
    rng = np.random.default_rng()
    # two rows or more each, so that even a batch of one request is reduced to a row it does not own
    requests = [mixed_dtype_inputs(rng, int(n)) for n in rng.integers(2, 5, size=6)]
    before = _failures(server)
    turn.mode = mode
    answers = fan_out(server, protocol, requests)
    assert all(isinstance(a, InferenceServerException) for a in answers), answers
    for error in answers:
        assert str(error.status()) in ("500", "StatusCode.INTERNAL"), error
        for word in ["model 'turning'", *words]:
            assert word in str(error), str(error)
    assert _failures(server) - before == len(requests)
    turn.mode = None
    healthy = fan_out(server, protocol, requests[:2])  # the server keeps serving once the engine behaves
    assert not any(isinstance(a, BaseException) for a in healthy), healthy


def test_without_the_check_the_same_engine_hands_out_foreign_rows(server: ServerThread, turn: type[Turn]) -> None:
    """The control: the check is what stands between this engine and wrong answers with status OK."""
    served = server.repository.get("turning", "")
    checks = [i.check for i in served.instances.instances]
    rng = np.random.default_rng()
    requests = [mixed_dtype_inputs(rng, 2) for _ in range(6)]
    try:
        for instance in served.instances.instances:
            instance.check = None
        turn.mode = "reduce"
        answers = fan_out(server, "http", requests)
    finally:
        turn.mode = None
        for instance, check in zip(served.instances.instances, checks, strict=True):
            instance.check = check
    ok = [a for a in answers if not isinstance(a, BaseException)]
    assert ok, "without the check, the bad batches were expected to answer with status OK"
    own = [x["a"] * np.float32(1.5) + x["b"].astype(np.int64).sum(axis=1, keepdims=True).astype(np.float32)
           for x in requests]
    wrong = [a for a, mine in zip(answers, own, strict=True) if not isinstance(a, BaseException)
             and (a["scaled"].shape != mine.shape or not np.allclose(a["scaled"], mine))]
    assert wrong, "the corrupting engine should have handed some request rows that are not its own"


# --- the pieces on their own ---------------------------------------------------------------------


def _check(batched: bool = True) -> OutputCheck:
    return OutputCheck("m", (TensorConfig("y", DType.FLOAT32, (-1, 3)), TensorConfig("k", DType.INT64, (1,))),
                       batched=batched)


def test_output_check_accepts_matching_outputs_and_any_size_dims() -> None:
    _check()({"y": np.zeros((5, 7, 3), np.float32), "k": np.zeros((5, 1), np.int64), "extra": np.zeros(2)}, 5)
    _check(batched=False)({"y": np.zeros((7, 3), np.float32), "k": np.zeros((1,), np.int64)}, 1)


Y, K = np.zeros((5, 2, 3), np.float32), np.zeros((5, 1), np.int64)


@pytest.mark.parametrize(("outputs", "words"), [
    ({"y": Y[:4], "k": K}, "'y' has shape [4, 2, 3] for a batch of 5"),
    ({"y": np.zeros((), np.float32), "k": K}, "'y' has shape [] for a batch of 5"),
    ({"y": Y, "k": K.astype(np.int32)}, "'k' is int32 but the config says TYPE_INT64"),
    ({"y": Y[:, 0], "k": K}, "'y' has shape [5, 3] but the config says [5, -1, 3]"),
    ({"y": Y}, "no output 'k' (it returned y)"),
])
def test_output_check_names_output_and_shapes(outputs: dict[str, np.ndarray], words: str) -> None:
    with pytest.raises(OutputMismatchError, match=re.escape(words)):
        _check()(outputs, 5)


def test_output_check_holds_the_engine_side_shape_of_a_reshaped_output_and_any_strings_for_bytes() -> None:
    check = OutputCheck("m", (TensorConfig("y", DType.FLOAT32, (1000,), reshape=(1000, 1, 1)),
                              TensorConfig("s", DType.BYTES, (2,))), batched=True)
    check({"y": np.zeros((3, 1000, 1, 1), np.float32), "s": np.array([[b"a", b"b"]] * 3, dtype=object)}, 3)
    check({"y": np.zeros((3, 1000, 1, 1), np.float32), "s": np.array([["a", "b"]] * 3)}, 3)
    words = "'y' has shape [3, 1000] but the config says [3, 1000, 1, 1]"
    with pytest.raises(OutputMismatchError, match=re.escape(words)):
        check({"y": np.zeros((3, 1000), np.float32), "s": np.array([[b"a", b"b"]] * 3, dtype=object)}, 3)
    with pytest.raises(OutputMismatchError, match="'s' is int64 but the config says TYPE_BYTES"):
        check({"y": np.zeros((3, 1000, 1, 1), np.float32), "s": np.zeros((3, 2), np.int64)}, 3)


def test_probe_reports_only_outputs_that_do_not_follow_with_every_shape_seen() -> None:
    def run(size: int) -> dict[str, np.ndarray]:
        return {"good": np.zeros((size, 2)), "fixed": np.zeros((1, 2)), "scalar": np.zeros(())}

    found = probe_batch_outputs(run, ["good", "fixed", "scalar"], probe_sizes(8))
    assert found == {"fixed": {1: (1, 2), 8: (1, 2)}, "scalar": {1: (), 8: ()}}
    assert probe_sizes(1) == (1,) and probe_batch_outputs(lambda n: None, ["good"], (1, 8)) == {}
    text = batch_refusal("m", {"fixed": found["fixed"]}, max_batch_size=8, fallback=False)
    assert "output 'fixed' has shape [1, 2] for a batch of 1, [1, 2] for a batch of 8" in text
    assert "refused" in text and "batching off" in batch_refusal("m", found, max_batch_size=8, fallback=True)
