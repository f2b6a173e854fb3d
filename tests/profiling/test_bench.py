"""benchmark(): runs on catalogue models with ONNX Runtime, export-times format, trtexec's warnings."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streamrt
from helpers import catalogue_file
from streamrt.backends.base import Engine, ExecutionContext
from streamrt.config import BuildConfig
from streamrt.errors import ConfigError, DTypeMismatchError
from streamrt.plan import PlanManifest
from streamrt.profiling.bench import (
    BenchSummary,
    IterationRecord,
    benchmark,
    benchmark_function,
    check_warnings,
)
from streamrt.running.inputs import random_inputs, resolve_shapes
from streamrt.testing.models import CATALOGUE
from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec

TRTEXEC_FIELDS = [
    "startEnqMs",
    "endEnqMs",
    "startH2dMs",
    "endH2dMs",
    "startComputeMs",
    "endComputeMs",
    "startD2hMs",
    "endD2hMs",
    "h2dMs",
    "computeMs",
    "d2hMs",
    "latencyMs",
]


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    tmp = tmp_path_factory.mktemp("bench")
    result = streamrt.build(
        catalogue_file("small_cnn", tmp),
        BuildConfig(profiles=CATALOGUE["small_cnn"].profiles),
        tmp / "cnn.plan",
        cache_dir=tmp / "cache",
    )
    return streamrt.load(result.path)


def _feeds(engine: Engine, batch: int) -> dict[str, np.ndarray]:
    shapes = resolve_shapes(engine.inputs, engine.profiles, batch=batch)
    return random_inputs(engine.inputs, shapes, np.random.default_rng(0))


def test_benchmark_ort_cpu_prints_summary(cnn: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    result = benchmark(cnn, _feeds(cnn, 4), warmup_ms=20, duration_s=0.2, iterations=5)
    s = result.summary
    assert s.queries >= 5 and s.batch == 4 and result.device == "cpu"
    assert s.walltime_s >= 0.2
    assert s.throughput_qps == pytest.approx(s.queries / s.walltime_s)
    assert s.items_per_s == pytest.approx(4 * s.throughput_qps)
    assert s.h2d.max == 0.0 and s.d2h.max == 0.0  # CPU engine: zero-length transfers
    assert s.compute.min > 0 and s.latency.mean == pytest.approx(s.compute.mean)
    assert s.total_compute_s <= s.walltime_s
    assert {w.code for w in result.warnings} <= {"unstable"}  # no transfer/enqueue checks on CPU
    text = result.format()
    print(text)
    assert "=== Performance summary ===" in text and "items/s (batch 4)" in text
    assert "zero-length: CPU engine" in text and "percentile(99%)" in text
    assert "Total Host Walltime" in text
    assert "=== Performance summary ===" in capsys.readouterr().out


def test_iterations_only_runs_exactly_that_many(cnn: Engine) -> None:
    result = benchmark(cnn, _feeds(cnn, 1), warmup_ms=0, duration_s=0, iterations=7)
    assert result.summary.queries == 7 and result.warmup_queries == 0


def test_export_times_is_well_formed(cnn: Engine, tmp_path: Path) -> None:
    result = benchmark(cnn, _feeds(cnn, 2), warmup_ms=10, duration_s=0, iterations=20)
    path = result.write_times(tmp_path / "times.json")
    times = json.loads(path.read_text())
    assert isinstance(times, list) and len(times) == 20
    for t in times:
        assert list(t) == TRTEXEC_FIELDS
        assert t["latencyMs"] == pytest.approx(t["h2dMs"] + t["computeMs"] + t["d2hMs"])
        assert t["computeMs"] == pytest.approx(t["endComputeMs"] - t["startComputeMs"])
        assert t["startEnqMs"] <= t["endEnqMs"] and t["startH2dMs"] <= t["endD2hMs"]
    starts = [t["startEnqMs"] for t in times]
    assert starts == sorted(starts) and starts[0] >= result.warmup_elapsed_ms
    data = result.to_json()
    json.dumps(data)
    assert data["summary"]["queries"] == 20 and "p99" in data["summary"]["latency_ms"]


def test_wrong_inputs_are_rejected_before_running(cnn: Engine) -> None:
    feeds = {"x": _feeds(cnn, 1)["x"].astype(np.float64)}
    with pytest.raises(DTypeMismatchError):
        benchmark(cnn, feeds, iterations=1, duration_s=0)


def test_bad_settings() -> None:
    with pytest.raises(ConfigError, match="iterations"):
        benchmark_function(lambda: None, label="f", iterations=0)
    with pytest.raises(ConfigError, match="duration"):
        benchmark_function(lambda: None, label="f", duration_s=-1)


def test_benchmark_function_times_a_callable() -> None:
    calls = []
    result = benchmark_function(
        lambda: calls.append(1), label="noop", batch=3, warmup_ms=0, duration_s=0, iterations=11
    )
    assert len(calls) == 11 and result.summary.batch == 3 and result.label == "noop"


# --- warnings from constructed samples ---------------------------------------------------------


def _records(compute: list[float], enqueue: float = 0.01, h2d: float = 0.0, d2h: float = 0.0) -> list[IterationRecord]:
    out, t = [], 0.0
    for c in compute:
        out.append(IterationRecord(t, t + enqueue, t, t + h2d, t + h2d, t + h2d + c, t + h2d + c, t + h2d + c + d2h))
        t += h2d + c + d2h
    return out


def _codes(records: list[IterationRecord], device: str) -> set[str]:
    return {w.code for w in check_warnings(BenchSummary.from_records(records, 1.0, 1), device)}


def test_stable_gpu_run_has_no_warnings() -> None:
    assert _codes(_records([1.0] * 50), "cuda") == set()


def test_unstable_when_cov_above_2_5_percent() -> None:
    assert _codes(_records([1.0, 1.06] * 25), "cuda") == {"unstable"}  # CoV 2.9 %
    assert _codes(_records([1.0, 1.04] * 25), "cuda") == set()  # CoV 1.96 %


def test_enqueue_bound_when_median_enqueue_above_0_8_compute() -> None:
    assert _codes(_records([1.0] * 10, enqueue=0.85), "cuda") == {"enqueue-bound"}
    assert _codes(_records([1.0] * 10, enqueue=0.75), "cuda") == set()
    assert _codes(_records([1.0] * 10, enqueue=1.0), "cpu") == set()  # CPU: enqueue is compute


def test_transfer_bound_when_median_transfer_at_least_compute() -> None:
    assert _codes(_records([1.0] * 10, h2d=1.0), "cuda") == {"h2d-bound"}
    assert _codes(_records([1.0] * 10, d2h=2.0), "cuda") == {"d2h-bound"}
    assert _codes(_records([1.0] * 10, h2d=0.5, d2h=0.9), "cuda") == set()


def test_warnings_appear_in_report_with_advice() -> None:
    records = _records([1.0, 1.2] * 10, enqueue=0.95)
    warnings = check_warnings(BenchSummary.from_records(records, 1.0, 1), "cuda")
    assert {w.code for w in warnings} == {"unstable", "enqueue-bound"}
    assert all(w.advice for w in warnings)
    assert "lock the GPU clocks" in next(w.advice for w in warnings if w.code == "unstable")


# --- the CUDA path, with a fake engine that runs a matmul on the current stream ----------------


def _manifest(device: str) -> PlanManifest:
    spec = TensorSpec("x", DType.FLOAT32, (-1, 256))
    return PlanManifest(
        backend="fake",
        backend_version="0",
        runtime_versions={},
        device={"kind": device},
        precision="fp32",
        inputs=(spec,),
        outputs=(TensorSpec("y", DType.FLOAT32, (-1, 256)),),
        profiles=(ShapeProfile({"x": ShapeRange((1, 256), (8, 256), (64, 256))}),),
        source_sha256="0",
        source_name="fake.onnx",
        build_settings={},
        build_command="",
        created_at="",
        streamrt_version="0",
    )


class _MatmulEngine(Engine):
    def __init__(self) -> None:
        import torch

        super().__init__(_manifest("cuda"))
        self.device_kind = "cuda"
        self.weight = torch.randn(256, 256, device="cuda")
        self.streams: set[Any] = set()

    def create_context(self) -> ExecutionContext:
        return _MatmulContext(self)


class _MatmulContext(ExecutionContext):
    engine: _MatmulEngine

    def _infer_impl(self, inputs: Mapping[str, Any], profile: int, stream: Any) -> dict[str, Any]:
        import torch

        if stream is not None:
            assert torch.cuda.current_stream() == stream  # enqueued on the stream it was given
            self.engine.streams.add(stream)
        x = inputs["x"]
        for _ in range(20):
            x = torch.tanh(x @ self.engine.weight)
        return {"y": x}


@pytest.mark.gpu
def test_cuda_engine_is_timed_with_events_on_a_side_stream(tmp_path: Path) -> None:
    import torch

    engine = _MatmulEngine()
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 256), dtype=np.float32)}
    result = benchmark(engine, feeds, warmup_ms=50, duration_s=0.3, iterations=20)
    s = result.summary
    assert result.device == "cuda" and s.queries >= 20 and s.batch == 64
    assert s.h2d.min > 0 and s.compute.min > 0 and s.d2h.min > 0
    assert s.latency.mean == pytest.approx(s.h2d.mean + s.compute.mean + s.d2h.mean, rel=1e-6)
    assert engine.streams and torch.cuda.default_stream() not in engine.streams
    times = json.loads(result.write_times(tmp_path / "t.json").read_text())
    for t in times:
        assert t["startH2dMs"] <= t["endH2dMs"] <= t["endComputeMs"] <= t["endD2hMs"]
    assert "GPU Compute Time" in result.format()


@pytest.mark.gpu
def test_run_numpy_moves_data_to_a_cuda_engine_and_back() -> None:
    import torch

    from streamrt.running.compare import run_numpy

    engine = _MatmulEngine()
    x = np.random.default_rng(1).standard_normal((4, 256), dtype=np.float32)
    out = run_numpy(engine, {"x": x})["y"]
    assert isinstance(out, np.ndarray) and out.shape == (4, 256)
    expected = torch.from_numpy(x).cuda()
    for _ in range(20):
        expected = torch.tanh(expected @ engine.weight)
    np.testing.assert_allclose(out, expected.cpu().numpy(), rtol=1e-5, atol=1e-5)
