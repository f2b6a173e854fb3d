"""Tracing on host streams: one span per stage and item, in dependency order."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict

import pytest

from streamrt.pipeline import Pipeline, PipelineConfig, Stage, StageKind

pytestmark = pytest.mark.timeout(30)


def sleepy(seconds: float):
    def fn(slot, item, stream) -> None:
        time.sleep(seconds)
        slot.output = item

    return fn


STAGES = [
    Stage("load", sleepy(0.001), kind=StageKind.HOST),
    Stage("h2d", sleepy(0.001), kind=StageKind.H2D),
    Stage("compute", sleepy(0.002)),
    Stage("d2h", sleepy(0.001), kind=StageKind.D2H),
]


@pytest.mark.parametrize("topology", ["sync", "streams", "single"])
def test_spans_follow_the_per_item_chain(topology: str) -> None:
    config = PipelineConfig(topology=topology, ring_size=3, device="cpu", trace=True)
    with Pipeline(STAGES, config) as pipe:
        list(pipe.map(range(3)))
        pipe.reset_trace()
        list(pipe.map(range(10)))
        trace = pipe.trace()
    assert trace.items == 10 and len(trace.latencies_ms) == 10
    assert len(trace.spans) == 10 * len(STAGES)
    assert trace.wall_ms > 0 and trace.items_per_s > 0
    by_item = defaultdict(dict)
    for span in trace.spans:
        assert span.end_ms >= span.start_ms >= trace.start_ms
        assert trace.tracks[span.track] == "host thread"
        by_item[span.item][span.stage] = span
    assert sorted(by_item) == list(range(3, 13))
    for spans in by_item.values():
        order = [spans[s.name] for s in STAGES]
        for before, after in itertools.pairwise(order):
            assert after.start_ms >= before.end_ms - 1e-6


def test_untraced_runs_still_count_latency() -> None:
    with Pipeline(STAGES[:1], PipelineConfig(device="cpu")) as pipe:
        list(pipe.map(range(5)))
        trace = pipe.trace()
    assert trace.items == 5 and trace.spans == [] and all(ms > 0 for ms in trace.latencies_ms)
    assert trace.meta["topology"] == "streams" and trace.label == "streams ring4"
