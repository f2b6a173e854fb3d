"""``launch_thread``: the CUDA stages after a host stage are launched by the lane's launcher, not by
the host stage's thread, items in order, and failures, timeouts and cancels behave as without it."""

from __future__ import annotations

import threading
import time

import pytest

from fake_cuda import FakeCudaStream
from pipeline_chain import chain_stages
from streamrt.device import Stream
from streamrt.errors import StageError, StageTimeoutError
from streamrt.pipeline import Pipeline, PipelineConfig, Slot, Stage, StageKind, Topology

pytestmark = pytest.mark.timeout(60)


def host_cuda_host_cuda() -> list[Stage]:
    base = chain_stages()
    return [base[0], base[1], Stage("host-mid", lambda slot, item, stream: None, kind=StageKind.HOST), base[2]]


@pytest.mark.parametrize("topology", [Topology.STREAMS, Topology.SINGLE])
def test_cuda_stages_after_host_stages_are_launched_by_the_lane_launcher(
    topology: Topology, delayed, fake_cuda_device
) -> None:
    FakeCudaStream.launched_from.clear()
    config = PipelineConfig(topology=topology, ring_size=2, workers=2, device="cpu", launch_thread=True)
    with Pipeline(delayed(host_cuda_host_cuda(), seed=4, max_s=0.001), config, device=fake_cuda_device) as pipe:
        assert [lane.launcher is not None for lane in pipe.lanes] == [True, True]
        results = list(pipe.map(range(120)))
    assert all(r.ok for r in results), next(r.error for r in results if not r.ok)
    assert [r.value for r in results] == [v * v + 1 for v in range(120)]
    launchers = FakeCudaStream.launched_from
    assert launchers and all(name.endswith("/launch") for name in launchers), launchers
    assert "launcher" in config.describe()


def test_a_lane_without_cuda_after_host_gets_no_launcher(fake_cuda_device) -> None:
    config = PipelineConfig(ring_size=2, device="cpu", launch_thread=True)
    with Pipeline(chain_stages(), config) as pipe:  # a CPU device: no CUDA stream anywhere
        assert pipe.lanes[0].launcher is None
        assert [r.value for r in pipe.map(range(5))] == [v * v + 1 for v in range(5)]


def test_the_synchronous_loop_gets_no_launcher(fake_cuda_device) -> None:
    config = PipelineConfig(topology=Topology.SYNC, device="cpu", launch_thread=True)
    with Pipeline(chain_stages(), config, device=fake_cuda_device) as pipe:
        assert pipe.lanes[0].launcher is None
        assert [r.value for r in pipe.map(range(5))] == [v * v + 1 for v in range(5)]
    assert "launcher" not in config.describe()


def test_the_host_stage_starts_its_next_item_while_the_launcher_waits(fake_cuda_device) -> None:
    """The launcher is busy launching item 0 (its first CUDA stage blocks the launcher until item 1's
    host stage ran): without the launcher the host thread would launch item 0 and never reach item 1."""
    loaded = [threading.Event() for _ in range(2)]

    def load(slot: Slot, item: int, stream: Stream) -> None:
        loaded[item].set()
        slot.output = item

    def launch_waits_for_next_load(slot: Slot, item: int, stream: Stream) -> None:
        slot.output = item * 10

    stages = [Stage("load", load, kind=StageKind.HOST), Stage("compute", launch_waits_for_next_load)]
    config = PipelineConfig(ring_size=2, device="cpu", launch_thread=True, stage_timeout_s=10)
    with Pipeline(stages, config, device=fake_cuda_device) as pipe:
        launcher = pipe.lanes[0].launcher
        assert launcher is not None
        launcher.launch(lambda: loaded[1].wait(5) or None)  # holds the launcher until item 1 is loaded
        t0 = time.perf_counter()
        pipe.submit(0)
        pipe.submit(1)
        assert loaded[1].wait(5), "the host stage did not run item 1 while item 0 waited to be launched"
        assert [pipe.get().value, pipe.get().value] == [0, 10]
    assert time.perf_counter() - t0 < 5


def test_a_failing_host_stage_fails_its_item_with_the_launcher(fake_cuda_device) -> None:
    def load(slot: Slot, item: int, stream: Stream) -> None:
        if item == 2:
            raise ValueError("bad frame 2")
        slot["a"] = (item, slot.input)

    stages = [Stage("load", load, kind=StageKind.HOST), *chain_stages()[1:]]
    config = PipelineConfig(ring_size=2, device="cpu", launch_thread=True)
    with Pipeline(stages, config, device=fake_cuda_device) as pipe:
        results = list(pipe.map(range(6)))
    assert [r.ok for r in results] == [True, True, False, True, True, True]
    assert isinstance(results[2].error, StageError) and results[2].error.stage == "load"
    assert [r.value for r in results if r.ok] == [v * v + 1 for v in (0, 1, 3, 4, 5)]


def test_a_stuck_host_stage_times_out_and_cancel_frees_the_launcher(fake_cuda_device) -> None:
    gate = threading.Event()

    def blocked(slot: Slot, item: int, stream: Stream) -> None:
        gate.wait(30)
        slot["a"] = (item, slot.input)

    stages = [Stage("blocked", blocked, kind=StageKind.HOST), *chain_stages()[1:]]
    config = PipelineConfig(ring_size=2, device="cpu", launch_thread=True, stage_timeout_s=0.2, close_timeout_s=2)
    pipe = Pipeline(stages, config, device=fake_cuda_device)
    pipe.submit(0)
    with pytest.raises(StageTimeoutError, match="stage 'blocked' did not finish item 0"):
        pipe.get()
    t0 = time.perf_counter()
    pipe.close(cancel=True)  # the launcher waits behind a barrier for the stuck stage: cancelled, not hung
    launcher_wait_s = time.perf_counter() - t0
    gate.set()
    assert launcher_wait_s < 5
