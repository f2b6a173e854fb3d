"""Errors fail one item, timeouts name the stuck stage, close() never hangs."""

from __future__ import annotations

import threading
import time

import pytest

from streamrt.device import Stream
from streamrt.errors import PipelineClosedError, PipelineError, StageError, StageTimeoutError
from streamrt.pipeline import Pipeline, PipelineConfig, Slot, Stage, StageKind, Topology

pytestmark = pytest.mark.timeout(60)


def failing_stages(bad_items: set[int], ran_after: list[int]) -> list[Stage]:
    def load(slot: Slot, item: int, stream: Stream) -> None:
        slot["x"] = slot.input

    def flaky(slot: Slot, item: int, stream: Stream) -> None:
        if item in bad_items:
            raise ValueError(f"bad frame {item}")
        slot["x"] *= 10

    def finish(slot: Slot, item: int, stream: Stream) -> None:
        ran_after.append(item)
        slot.output = slot["x"]

    return [Stage("load", load, kind=StageKind.HOST), Stage("flaky", flaky), Stage("finish", finish)]


@pytest.mark.parametrize("topology", list(Topology))
def test_a_failing_stage_fails_only_its_item(topology: Topology) -> None:
    ran_after: list[int] = []
    config = PipelineConfig(topology=topology, ring_size=2, device="cpu")
    with Pipeline(failing_stages({3, 7}, ran_after), config) as pipe:
        results = list(pipe.map(range(12)))
    assert [r.item for r in results] == list(range(12))
    for r in results:
        if r.item in (3, 7):
            assert isinstance(r.error, StageError)
            assert (r.error.stage, r.error.item) == ("flaky", r.item)
            assert isinstance(r.error.cause, ValueError)
            with pytest.raises(StageError, match="bad frame"):
                r.unwrap()
        else:
            assert r.unwrap() == r.item * 10
    assert 3 not in ran_after and 7 not in ran_after  # later stages of a failed item are skipped


def test_a_failing_collector_fails_its_item() -> None:
    def collect(slot: Slot, item: int) -> int:
        if item == 1:
            raise KeyError("no output")
        return int(slot.output)

    stage = Stage("id", lambda slot, item, stream: setattr(slot, "output", item))
    with Pipeline([stage], PipelineConfig(device="cpu"), collect=collect) as pipe:
        results = list(pipe.map(range(3)))
    assert [r.ok for r in results] == [True, False, True]
    assert isinstance(results[1].error, StageError) and results[1].error.stage == "collect"


def gated_stages(gate: threading.Event, started: list[int]) -> list[Stage]:
    def load(slot: Slot, item: int, stream: Stream) -> None:
        started.append(item)

    def blocked(slot: Slot, item: int, stream: Stream) -> None:
        gate.wait(20)
        slot.output = slot.input

    return [Stage("load", load, kind=StageKind.HOST), Stage("blocked", blocked)]


@pytest.mark.parametrize("workers", [1, 2])
def test_backpressure_bounds_in_flight_work(workers: int) -> None:
    gate = threading.Event()
    started: list[int] = []
    config = PipelineConfig(ring_size=3, workers=workers, device="cpu", stage_timeout_s=20)
    with Pipeline(gated_stages(gate, started), config) as pipe:
        for value in range(config.in_flight):
            pipe.submit(value)  # fills every slot without blocking
        assert pipe.in_flight == config.in_flight
        blocked_submit = threading.Thread(target=pipe.submit, args=(99,))
        blocked_submit.start()
        blocked_submit.join(0.3)
        assert blocked_submit.is_alive(), "submit() must block while the ring is full"
        assert len(started) <= config.in_flight
        gate.set()
        blocked_submit.join(10)
        assert not blocked_submit.is_alive()
        results = [pipe.get() for _ in range(config.in_flight + 1)]
    assert [r.value for r in results] == [*range(config.in_flight), 99]


def test_close_drains_in_flight_work_and_keeps_results() -> None:
    stage = Stage("slow", lambda slot, item, stream: (time.sleep(0.01), setattr(slot, "output", item)))
    pipe = Pipeline([stage], PipelineConfig(ring_size=4, device="cpu"))
    for value in range(4):
        pipe.submit(value)
    pipe.close()
    assert [pipe.get().value for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(PipelineClosedError):
        pipe.get()
    with pytest.raises(PipelineClosedError):
        pipe.submit(5)
    assert pipe.slots == []  # buffers freed
    pipe.close()  # idempotent


def test_close_cancel_with_work_in_flight_returns_promptly() -> None:
    gate = threading.Event()
    started: list[int] = []
    pipe = Pipeline(gated_stages(gate, started), PipelineConfig(ring_size=4, device="cpu", close_timeout_s=0.3))
    for value in range(4):
        pipe.submit(value)
    t0 = time.perf_counter()
    pipe.close(cancel=True)  # the running stage is stuck behind the gate: reported, not waited for
    assert time.perf_counter() - t0 < 5
    gate.set()
    assert pipe.poll() == []


def test_exception_in_with_block_cancels() -> None:
    gate = threading.Event()
    config = PipelineConfig(device="cpu", close_timeout_s=0.3)
    with pytest.raises(RuntimeError, match="caller"), Pipeline(gated_stages(gate, []), config) as pipe:
        pipe.submit(1)
        raise RuntimeError("caller failed")
    gate.set()


def test_a_stuck_stage_is_reported_with_a_timeout() -> None:
    gate = threading.Event()
    config = PipelineConfig(ring_size=2, device="cpu", stage_timeout_s=0.2, close_timeout_s=0.3)
    pipe = Pipeline(gated_stages(gate, []), config)
    pipe.submit(0)
    t0 = time.perf_counter()
    with pytest.raises(StageTimeoutError, match=r"stage 'blocked' did not finish item 0 within 0.2 s"):
        pipe.get()
    assert time.perf_counter() - t0 < 5
    with pytest.raises(PipelineError, match="unusable"):
        pipe.submit(1)
    pipe.close()
    gate.set()


def test_get_with_nothing_in_flight_is_a_clear_error() -> None:
    stage = Stage("s", lambda slot, item, stream: None)
    with Pipeline([stage], PipelineConfig(device="cpu")) as pipe, pytest.raises(PipelineError, match="nothing"):
        pipe.get()


def test_setup_failure_releases_worker_threads() -> None:
    before = threading.active_count()

    def bad_setup(slot: Slot) -> None:
        raise MemoryError("no room for buffers")

    stages = [Stage("a", lambda s, i, st: None, kind="host"), Stage("b", lambda s, i, st: None)]
    with pytest.raises(MemoryError):
        Pipeline(stages, PipelineConfig(device="cpu", workers=2), setup_slot=bad_setup)
    deadline = time.perf_counter() + 5
    while threading.active_count() > before and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= before  # (threads of earlier tests may finish meanwhile)
