"""An instance's lanes: the next batch is gathered and staged while the current one runs the engine.

With one lane an instance gathers, stages, runs and copies back one batch before it takes the next; over a
host transport the GPU then idled while the host gathered (docs/benchmarks/2026-12-05-h200-s4.md). These
tests run a real ONNX Runtime engine behind an instance on the CPU, held inside its run by the test, and
check what the lanes promise: a second batch is taken and gathered while the first one runs, the engine
still runs one batch at a time, every batch gets its own rows back, and the scheduler hands an instance as
many batches as it has lanes (one under the rate limiter). The CUDA side (a copy stream per lane, the
instance's stream waiting for it) is the GPU variant of ``test_batch_property.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import pytest

import streamrt
from streamrt.backends.base import Engine, ExecutionContext
from streamrt.device import get_device
from streamrt.errors import ConfigError
from streamrt.serve.execution.instances import BatchResult, Instance, default_lanes
from streamrt.serve.scheduling.loop import Executor
from streamrt.serve.scheduling.scheduler import lane_order
from streamrt.testing.batch_models import (
    mixed_dtype_inputs,
    mixed_dtype_model,
    mixed_dtype_profiles,
    mixed_dtype_reference,
)

pytestmark = pytest.mark.timeout(120)


class HeldEngine(Engine):
    """A real engine whose runs wait until the test lets them go, counting how many run at once."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner.manifest)
        self.inner, self.device_kind = inner, inner.device_kind
        self.go = threading.Event()
        self.entered = threading.Semaphore(0)
        self.running = 0
        self.most_at_once = 0
        self.lock = threading.Lock()

    def create_context(self) -> ExecutionContext:
        return HeldContext(self)

    def close(self) -> None:
        self.inner.close()
        super().close()


class HeldContext(ExecutionContext):
    engine: HeldEngine

    def __init__(self, engine: HeldEngine) -> None:
        super().__init__(engine)
        self.inner = engine.inner.create_context()

    def _infer_impl(self, inputs: Mapping[str, Any], profile: int, stream: Any) -> dict[str, Any]:
        held = self.engine
        with held.lock:
            held.running += 1
            held.most_at_once = max(held.most_at_once, held.running)
        held.entered.release()
        held.go.wait(30)
        try:
            return {k: np.asarray(v).copy() for k, v in self.inner.infer(inputs, stream).items()}
        finally:
            with held.lock:
                held.running -= 1


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("lanes")
    onnx.save(mixed_dtype_model(), str(folder / "m.onnx"))
    config = streamrt.BuildConfig(backend="onnxruntime", profiles=mixed_dtype_profiles(),
                                  backend_options={"threads": 1})
    return streamrt.build(folder / "m.onnx", config, folder / "m.plan", cache_dir=folder / "cache").path


@pytest.fixture
def held(plan: Path) -> Iterator[HeldEngine]:
    engine = HeldEngine(streamrt.load(plan))
    yield engine
    engine.go.set()
    engine.close()


def _instance(engine: Engine, lanes: int) -> Instance:
    return Instance("m_1_0", engine, get_device("cpu"), batched=True, max_batch_size=16, lanes=lanes)


def test_a_second_lane_gathers_its_batch_while_the_first_runs_and_the_engine_runs_one_at_a_time(
    held: HeldEngine,
) -> None:
    instance = _instance(held, lanes=2)
    gathered: list[str] = []
    gather = instance._gather

    def recording_gather(requests: Any, lane: Any) -> Any:
        out = gather(requests, lane)
        gathered.append(threading.current_thread().name)
        return out

    instance._gather = recording_gather  # type: ignore[method-assign]
    rng = np.random.default_rng()
    batches = [[mixed_dtype_inputs(rng, 2), mixed_dtype_inputs(rng, 3 + i)] for i in range(2)]
    results: list[BatchResult | BaseException] = []
    done = threading.Semaphore(0)

    def finished(result: BatchResult | BaseException) -> None:
        results.append(result)
        done.release()

    try:
        instance.submit(batches[0], finished)
        assert held.entered.acquire(timeout=10), "the first batch never reached the engine"
        instance.submit(batches[1], finished)
        for _ in range(200):  # the second lane gathers while the first batch is held in the engine
            if len(gathered) == 2:
                break
            threading.Event().wait(0.01)
        assert len(gathered) == 2 and gathered[0] != gathered[1], \
            f"the second batch was not gathered on its own lane while the first ran: {gathered}"
        assert held.running == 1, "the second batch entered the engine while the first was in it"
        held.go.set()
        assert done.acquire(timeout=10) and done.acquire(timeout=10), "a batch never finished"
    finally:
        instance.close(timeout=10)
    assert held.most_at_once == 1, "two lanes ran the engine at once"
    by_rows = {r.rows: r for r in results if isinstance(r, BatchResult)}
    assert sorted(by_rows) == [5, 6], f"a batch failed: {results}"
    for batch in batches:
        result = by_rows[sum(len(r["a"]) for r in batch)]
        for request, outputs in zip(batch, result.outputs, strict=True):
            want = mixed_dtype_reference(request)
            for name, value in want.items():
                np.testing.assert_allclose(outputs[name], value, rtol=1e-3, atol=1e-3, err_msg=name)


def test_one_lane_takes_the_next_batch_only_after_the_last(held: HeldEngine) -> None:
    instance = _instance(held, lanes=1)
    gathered: list[int] = []
    gather = instance._gather

    def recording_gather(requests: Any, lane: Any) -> Any:
        gathered.append(len(requests))
        return gather(requests, lane)

    instance._gather = recording_gather  # type: ignore[method-assign]
    rng = np.random.default_rng()
    done = threading.Semaphore(0)
    try:
        instance.submit([mixed_dtype_inputs(rng, 1)], lambda _: done.release())
        assert held.entered.acquire(timeout=10)
        instance.submit([mixed_dtype_inputs(rng, 1), mixed_dtype_inputs(rng, 1)], lambda _: done.release())
        threading.Event().wait(0.2)
        assert gathered == [1], "one lane gathered the next batch while its last one ran"
        held.go.set()
        assert done.acquire(timeout=10) and done.acquire(timeout=10)
        assert gathered == [1, 2]
    finally:
        instance.close(timeout=10)


class _Executor:
    def __init__(self, name: str, lanes: int, limited: bool = False) -> None:
        self.name, self.lanes = name, lanes
        self.rate_limit: Any = object() if limited else None


def test_the_scheduler_offers_each_lane_first_lanes_first_and_one_under_the_rate_limiter() -> None:
    a, b, c = (cast(Executor, e) for e in (_Executor("a", 2), _Executor("b", 3), _Executor("c", 2, limited=True)))
    assert [e.name for e in lane_order([a, b, c])] == ["a", "b", "c", "a", "b", "b"]
    assert lane_order([]) == []


def test_lanes_default_to_one_and_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMRT_INSTANCE_LANES", raising=False)
    assert default_lanes() == 1
    monkeypatch.setenv("STREAMRT_INSTANCE_LANES", "3")
    assert default_lanes() == 3
    for bad in ("0", "two"):
        monkeypatch.setenv("STREAMRT_INSTANCE_LANES", bad)
        with pytest.raises(ConfigError, match="STREAMRT_INSTANCE_LANES must be a whole number of 1 or more"):
            default_lanes()
