"""PipelineConfig validation, stage validation and how topologies map stages onto streams."""

from __future__ import annotations

import pytest

from streamrt.errors import ConfigError
from streamrt.pipeline import Pipeline, PipelineConfig, Stage, StageKind, Topology

pytestmark = pytest.mark.timeout(30)


def noop(slot, item, stream) -> None:
    return None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"topology": "ring"}, "topology must be one of sync, streams, single, got 'ring'"),
        ({"workers": 0}, "workers must be an integer >= 1, got 0"),
        ({"ring_size": True}, "ring_size must be an integer >= 1, got True"),
        ({"stage_timeout_s": 0}, "stage_timeout_s must be a number of seconds > 0, got 0"),
        ({"topology": "sync", "workers": 2}, "the sync topology runs one worker, got workers=2"),
        ({"device": "tpu"}, "device must be one of auto, cuda, cpu, got 'tpu'"),
    ],
)
def test_bad_values_are_named(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        PipelineConfig(**changes)


def test_from_dict_round_trip_and_unknown_keys() -> None:
    cfg = PipelineConfig.from_dict({"topology": "SINGLE", "workers": 3, "ring_size": 2, "cuda_graphs": True})
    assert cfg.topology is Topology.SINGLE and cfg.in_flight == 6
    assert PipelineConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.describe() == "single x3 ring2 graphs"
    with pytest.raises(ConfigError, match="unknown PipelineConfig keys \\['rings'\\]"):
        PipelineConfig.from_dict({"rings": 2})
    assert PipelineConfig(topology="sync").slots_per_lane == 1
    assert PipelineConfig(topology="sync").use_pinned is False
    assert PipelineConfig().use_pinned is True
    assert PipelineConfig(pinned=False).use_pinned is False


def test_stage_validation() -> None:
    assert Stage("h", noop, kind="host").on_host
    assert Stage("c", noop, stream="in").group == "in"
    with pytest.raises(ConfigError, match="kind must be one of"):
        Stage("x", noop, kind="gpu")
    with pytest.raises(ConfigError, match="cannot be captured"):
        Stage("x", noop, kind=StageKind.HOST, graphable=True)
    with pytest.raises(ConfigError, match="callable"):
        Stage("x", 3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unique"):
        Pipeline([Stage("a", noop), Stage("a", noop)], PipelineConfig(device="cpu"))
    with pytest.raises(ConfigError, match="at least one stage"):
        Pipeline([], PipelineConfig(device="cpu"))


STAGES = [
    Stage("load", noop, kind=StageKind.HOST, stream="load"),
    Stage("h2d", noop, kind=StageKind.H2D, stream="in"),
    Stage("pre", noop, stream="in"),
    Stage("engine", noop),
    Stage("d2h", noop, kind=StageKind.D2H),
]


def stream_names(topology: str, workers: int = 1) -> list[list[str]]:
    with Pipeline(STAGES, PipelineConfig(topology=topology, workers=workers, device="cpu")) as pipe:
        names = [[s.name for s in lane.streams] for lane in pipe.lanes]
        assert all(slot.pinned is pipe.config.use_pinned for slot in pipe.slots)
        assert len(pipe.slots) == workers * pipe.config.slots_per_lane
        return names


def test_stage_per_stream_topology_shares_streams_by_group() -> None:
    assert stream_names("streams") == [["lane0/load", "lane0/in", "lane0/in", "lane0/engine", "lane0/d2h"]]


def test_single_topology_puts_device_stages_on_one_stream() -> None:
    assert stream_names("single", workers=2) == [
        ["lane0/load", "lane0/main", "lane0/main", "lane0/main", "lane0/main"],
        ["lane1/load", "lane1/main", "lane1/main", "lane1/main", "lane1/main"],
    ]


def test_sync_topology_runs_inline_on_a_cpu_device() -> None:
    assert stream_names("sync") == [["lane0/inline"] * 5]


def test_cuda_graphs_are_ignored_without_cuda() -> None:
    stages = [Stage("g", lambda slot, item, stream: setattr(slot, "output", item), graphable=True)]
    with Pipeline(stages, PipelineConfig(device="cpu", cuda_graphs=True)) as pipe:
        assert pipe.graphs_captured == 0
        assert [r.value for r in pipe.map("abc")] == [0, 1, 2]
