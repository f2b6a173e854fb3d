"""Per-item timing collected by the pipeline: stage spans and latencies.

On CUDA a stage's span comes from two timing events recorded around it on its stream (what the
GPU did), plus an ``enqueue`` span on the host thread that launched it (what Python paid). On host
streams the span is the host clock around the work. Both are put on one time axis, in ms from
the start of the trace: CUDA times are measured from a reference event that is synchronised
once, when the trace starts, with the host clock.

Spans are read when an item is collected (its events have completed), so tracing adds two event
records per CUDA stage and no host sync. :mod:`streamrt.profiling` turns a :class:`PipelineTrace`
into Chrome-trace JSON, a PNG timeline and a summary.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamrt.device.base import Event, Stream

if TYPE_CHECKING:
    from streamrt.pipeline.ring import SlotState
    from streamrt.pipeline.stage import Stage

__all__ = ["ENQUEUE", "TRACK_CUDA", "TRACK_HOST", "PipelineTrace", "StageSpan", "TraceClock", "add_item_spans"]

ENQUEUE = "enqueue"
"""Span kind of the host time spent launching a CUDA stage."""
TRACK_CUDA = "cuda stream"
TRACK_HOST = "host thread"


@dataclass(frozen=True)
class StageSpan:
    """One stage execution for one item on one track (a CUDA stream or a host thread)."""

    stage: str
    item: int
    lane: int
    track: str
    kind: str  # a StageKind value, or ENQUEUE
    start_ms: float
    end_ms: float
    failed: bool = False

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms


@dataclass
class PipelineTrace:
    """What one measured run looked like.

    Attributes:
        label: the configuration, e.g. ``streams x2 ring4 graphs``.
        spans: stage spans (empty unless tracing was on).
        latencies_ms: per item, ``submit()`` to result collected, in completion order.
        start_ms, end_ms: the run's window on the trace clock (first submit, last collect).
        tracks: every track seen, mapped to :data:`TRACK_CUDA` or :data:`TRACK_HOST`, in order.
        meta: free-form facts (device, topology, workers, ring size).
        items: items collected in the window.
    """

    label: str
    spans: list[StageSpan] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    start_ms: float | None = None
    end_ms: float | None = None
    tracks: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    items: int = 0
    max_latencies: int = 1_000_000  # a long-running pipeline must not grow without bound

    def add_latency(self, ms: float) -> None:
        """Count one collected item and keep its latency (up to ``max_latencies``)."""
        self.items += 1
        if len(self.latencies_ms) < self.max_latencies:
            self.latencies_ms.append(ms)

    @property
    def wall_ms(self) -> float:
        if self.start_ms is None or self.end_ms is None:
            return 0.0
        return self.end_ms - self.start_ms

    @property
    def items_per_s(self) -> float:
        return self.items / (self.wall_ms / 1e3) if self.wall_ms > 0 else 0.0


class TraceClock:
    """Maps host ``perf_counter`` values and CUDA timing events onto one ms axis.

    The CUDA reference event is recorded on ``cuda_stream`` and synchronised once here
    (construction happens outside the steady state); afterwards a CUDA event's time is
    ``reference.elapsed_ms(event)`` plus the host time at which the reference completed.
    """

    def __init__(self, cuda_stream: Stream | None = None) -> None:
        self._t0 = time.perf_counter()
        self._ref: Event | None = None
        self._ref_ms = 0.0
        if cuda_stream is not None:
            self._ref = cuda_stream.record(cuda_stream.new_event(timing=True))
            self._ref.synchronize()
            self._ref_ms = self.host_ms(time.perf_counter())

    def host_ms(self, t: float) -> float:
        """A ``time.perf_counter()`` value on the trace axis."""
        return (t - self._t0) * 1e3

    def now_ms(self) -> float:
        return self.host_ms(time.perf_counter())

    def event_ms(self, event: Event) -> float:
        """A completed CUDA timing event on the trace axis."""
        if self._ref is None:
            raise ValueError("this trace clock has no CUDA reference (host device)")
        return self._ref_ms + self._ref.elapsed_ms(event)


def add_item_spans(
    trace: PipelineTrace, clock: TraceClock, stages: Sequence[Stage], state: SlotState, item: int, failed: bool
) -> None:
    """Append the spans of one collected item (its events have completed) to ``trace``.

    A CUDA stage gives a span on its stream (from its timing events) and an ``enqueue`` span on
    the host thread that launched it; a host stage gives one span on the thread that ran it.
    Stages skipped after a failure give none.
    """
    lane = state.slot.lane
    for j, stage in enumerate(stages):
        if not state.ran[j]:
            continue
        stream = lane.streams[j]
        host = (clock.host_ms(state.host_t0[j]), clock.host_ms(state.host_t1[j]))
        thread = state.thread[j]
        start_event = state.starts[j]
        if stream.is_cuda and start_event is not None:
            device = (clock.event_ms(start_event), clock.event_ms(state.ends[j]))
            trace.tracks.setdefault(stream.name, TRACK_CUDA)
            trace.spans.append(StageSpan(stage.name, item, lane.index, stream.name, stage.kind.value, *device, failed))
            trace.spans.append(StageSpan(stage.name, item, lane.index, thread, ENQUEUE, *host, failed))
        else:
            trace.spans.append(StageSpan(stage.name, item, lane.index, thread, stage.kind.value, *host, failed))
        trace.tracks.setdefault(thread, TRACK_HOST)
