"""Results come back in input order and every item sees only its own slot's data."""

from __future__ import annotations

import pytest

from pipeline_chain import chain_stages
from streamrt.pipeline import Pipeline, PipelineConfig, Stage, StageKind, Topology

pytestmark = pytest.mark.timeout(60)


CONFIGS = [
    PipelineConfig(topology=Topology.SYNC, device="cpu"),
    PipelineConfig(topology=Topology.STREAMS, ring_size=2, device="cpu"),
    PipelineConfig(topology=Topology.SINGLE, ring_size=2, workers=3, device="cpu"),
    PipelineConfig(topology=Topology.STREAMS, ring_size=3, workers=2, device="cpu"),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.describe())
def test_results_in_input_order_under_random_delays(config: PipelineConfig, delayed) -> None:
    stages = delayed(chain_stages(), seed=1, max_s=0.002)
    with Pipeline(stages, config) as pipe:
        results = list(pipe.map(range(60)))
    assert [r.item for r in results] == list(range(60))
    assert [r.unwrap() for r in results] == [v * v + 1 for v in range(60)]


def test_slot_reuse_stress_ring_of_two(delayed) -> None:
    config = PipelineConfig(topology=Topology.STREAMS, ring_size=2, device="cpu")
    stages = delayed(chain_stages(), seed=2, max_s=0.0003)
    with Pipeline(stages, config) as pipe:
        results = list(pipe.map(range(800)))
    assert all(r.ok for r in results), next(r.error for r in results if not r.ok)
    assert [r.value for r in results] == [v * v + 1 for v in range(800)]


@pytest.mark.parametrize("topology", [Topology.STREAMS, Topology.SINGLE])
def test_cuda_stages_after_host_stages_are_launched_from_the_host_stream(
    topology: Topology, delayed, fake_cuda_device
) -> None:
    """host -> cuda -> host -> cuda: CUDA streams may not wait for pending host events, so the
    executor continues the launch on the host worker; order and data must survive."""
    base = chain_stages()
    stages = [
        base[0],
        base[1],
        Stage("host-mid", lambda slot, item, stream: None, kind=StageKind.HOST),
        base[2],
    ]
    config = PipelineConfig(topology=topology, ring_size=2, workers=2, device="cpu")
    with Pipeline(delayed(stages, seed=3, max_s=0.001), config, device=fake_cuda_device) as pipe:
        assert pipe.lanes[0].streams[1].is_cuda and not pipe.lanes[0].streams[0].is_cuda
        results = list(pipe.map(range(120)))
    assert all(r.ok for r in results), next(r.error for r in results if not r.ok)
    assert [r.value for r in results] == [v * v + 1 for v in range(120)]
    launchers = type(pipe.lanes[0].streams[1]).launched_from  # type: ignore[attr-defined]
    assert any(name.endswith("/load") for name in launchers), launchers
    assert any(name.endswith("/host-mid") for name in launchers), launchers


def test_submit_get_and_poll_by_hand() -> None:
    config = PipelineConfig(ring_size=2, device="cpu")
    with Pipeline(chain_stages(), config) as pipe:
        items = [pipe.submit(v) for v in (3, 4)]
        assert items == [0, 1]
        assert pipe.get().value == 10
        assert pipe.get().value == 17
        assert pipe.in_flight == 0 and pipe.poll() == []
