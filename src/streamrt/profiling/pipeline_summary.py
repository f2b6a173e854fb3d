"""Per-run pipeline summary: throughput, latency percentiles, busy fractions, hidden copy time.

The performance model (``DESIGN.md``): a pipeline is bound by its busiest resource, the H2D copy
engine, the D2H copy engine, the SMs, or a host thread (the one enqueuing work in Python, or a
host stage). From a trace this module computes, over the run's wall window:

* ``track_busy``: the fraction of time each CUDA stream / host thread had a span running;
* ``resource_busy``: the same per resource. CUDA spans are pooled by kind across streams
  (``H2D copy``, ``D2H copy``, ``GPU compute``: the union, i.e. time when at least one such
  operation ran); every host thread is its own resource;
* ``bound_items_per_s = items_per_s / busiest fraction``: the throughput at which the busiest
  resource would be busy 100% of the time. ``efficiency`` (the busiest fraction) is therefore the
  achieved share of that bound: 0.9 means "within 10% of the bound";
* ``copy_hidden``: the fraction of copy time that overlapped with compute on another stream;
* ``compute_gaps``: the stretches with no compute between the first and the last compute span (the GPU's, or
  the host engine's): their share of that window, how many lasted over :data:`GAP_MS` and the longest. A
  long one while frames wait is the host not enqueuing the next call: on an H100 on 2026-12-06, 156 camera
  streams dropped frames with GPU compute 67% busy and 34 such stretches over 20 ms (up to 63 ms) in 10 s.

Caveat, worth knowing when reading GPU numbers: a CUDA span runs from the event before a stage
to the event after it, so an eager, launch-bound stage has GPU idle gaps inside its span. Its
"GPU compute" busy is then high although the SMs idle, and the enqueuing host thread shows as
busy as well; CUDA graphs remove the gaps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from streamrt.measure.rounds import Rounds, format_ratio
from streamrt.pipeline.tracing import ENQUEUE, TRACK_CUDA, PipelineTrace

__all__ = ["BOUND_FLAG", "GAP_MS", "PipelineSummary", "compute_gaps", "format_comparison", "summarize"]

GAP_MS = 20.0
"""A compute-idle stretch longer than this is counted in ``compute_gaps`` (about three engine calls of the detector at
batch 128 on an H100, 6.9 ms each)."""

_RESOURCE_OF_KIND = {"h2d": "H2D copy", "d2h": "D2H copy", "compute": "GPU compute"}
_COPY_KINDS = ("h2d", "d2h")

Interval = tuple[float, float]


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping intervals into sorted, disjoint ones."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _length(union: Sequence[Interval]) -> float:
    return sum(end - start for start, end in union)


def compute_gaps(union: Sequence[Interval], over_ms: float = GAP_MS) -> dict[str, float]:
    """Idle stretches between the disjoint, sorted compute ``union``: their share of its window, the count over
    ``over_ms`` and the longest (ms). Empty for fewer than two intervals."""
    if len(union) < 2:
        return {}
    gaps = [b[0] - a[1] for a, b in pairwise(union)]
    window = union[-1][1] - union[0][0]
    return {"idle_share": sum(gaps) / window if window > 0 else 0.0, "over": float(sum(g > over_ms for g in gaps)),
            "over_ms": over_ms, "longest_ms": max(gaps)}


def _overlap(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Total length of the intersection of two disjoint, sorted interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass(frozen=True)
class PipelineSummary:
    """Numbers of one run (see the module docstring for their meaning)."""

    label: str
    items: int
    wall_ms: float
    items_per_s: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    track_busy: dict[str, float] = field(default_factory=dict)
    resource_busy: dict[str, float] = field(default_factory=dict)
    copy_hidden: float | None = None
    stage_ms: dict[str, float] = field(default_factory=dict)
    enqueue_ms_per_item: float | None = None
    compute_gaps: dict[str, float] = field(default_factory=dict)

    @property
    def bottleneck(self) -> tuple[str, float] | None:
        """The busiest resource and its busy fraction, if the run was traced."""
        if not self.resource_busy:
            return None
        name = max(self.resource_busy, key=lambda k: self.resource_busy[k])
        return name, self.resource_busy[name]

    @property
    def efficiency(self) -> float | None:
        """Busy fraction of the busiest resource: achieved throughput / its bound."""
        return None if self.bottleneck is None else self.bottleneck[1]

    @property
    def bound_items_per_s(self) -> float | None:
        """Throughput at which the busiest resource would be saturated."""
        eff = self.efficiency
        return self.items_per_s / eff if eff else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["bottleneck"] = self.bottleneck
        out["bound_items_per_s"] = self.bound_items_per_s
        return out


def summarize(trace: PipelineTrace) -> PipelineSummary:
    """Compute a :class:`PipelineSummary` from a trace (spans optional)."""
    lat = np.asarray(trace.latencies_ms, dtype=np.float64)
    latency = {}
    if lat.size:
        latency = {"mean": float(lat.mean())}
        latency.update({f"p{q}": float(np.percentile(lat, q)) for q in (50, 90, 99)})
    wall = trace.wall_ms
    base = PipelineSummary(trace.label, trace.items, wall, trace.items_per_s, latency)
    if not trace.spans or wall <= 0 or trace.start_ms is None or trace.end_ms is None:
        return base
    lo, hi = trace.start_ms, trace.end_ms

    def clip(start: float, end: float) -> Interval:
        return max(start, lo), max(min(end, hi), max(start, lo))

    by_track: dict[str, list[Interval]] = defaultdict(list)
    by_resource: dict[str, list[Interval]] = defaultdict(list)
    by_kind: dict[str, list[Interval]] = defaultdict(list)
    stage_sum: dict[str, float] = defaultdict(float)
    stage_count: dict[str, int] = defaultdict(int)
    enqueue_total = 0.0
    for span in trace.spans:
        interval = clip(span.start_ms, span.end_ms)
        by_track[span.track].append(interval)
        cuda = trace.tracks.get(span.track) == TRACK_CUDA
        by_resource[_RESOURCE_OF_KIND.get(span.kind, span.kind) if cuda else f"thread {span.track}"].append(interval)
        by_kind[span.kind].append(interval)
        if span.kind == ENQUEUE:
            enqueue_total += span.duration_ms
        else:
            stage_sum[span.stage] += span.duration_ms
            stage_count[span.stage] += 1
    copies = _union(i for kind in _COPY_KINDS for i in by_kind.get(kind, []))
    compute = _union(by_kind.get("compute", []))
    copy_total = _length(copies)
    return PipelineSummary(
        label=trace.label,
        items=trace.items,
        wall_ms=wall,
        items_per_s=trace.items_per_s,
        latency_ms=latency,
        track_busy={t: _length(_union(v)) / wall for t, v in sorted(by_track.items())},
        resource_busy={r: _length(_union(v)) / wall for r, v in sorted(by_resource.items())},
        copy_hidden=_overlap(copies, compute) / copy_total if copy_total > 0 else None,
        stage_ms={s: stage_sum[s] / stage_count[s] for s in stage_sum},
        enqueue_ms_per_item=enqueue_total / trace.items if ENQUEUE in by_kind and trace.items else None,
        compute_gaps=compute_gaps(compute),
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


BOUND_FLAG = "(!)"
"""Marks a bound below the measured throughput (see :func:`format_comparison`)."""


def format_comparison(
    rows: Sequence[tuple[PipelineSummary, PipelineSummary | None]],
    *,
    baseline: int = 0,
    rounds: Sequence[Rounds] | None = None,
) -> str:
    """A markdown table comparing runs side by side.

    Each row is ``(timed, traced)``: throughput and latency come from the untraced run
    ``timed``; the busiest resource, its busy fraction, the bound and the hidden copy time from
    the traced run ``traced`` (tracing adds a little host work per stage, so it is kept out of the
    throughput figures; busy fraction and bound are both of the traced run, so they agree).

    With ``rounds`` (one per row: the throughput of every timed round), a column gives their
    spread, and "vs base" reads "baseline unstable" when the baseline's rounds are noisy
    (:mod:`streamrt.measure.rounds`). A bound below the timed throughput, a contradiction that
    a slowed traced run produces (tracing overhead, or noise during that run), is marked
    :data:`BOUND_FLAG` and explained under the table instead of being passed off as a limit.
    """
    base = rows[baseline][0].items_per_s if rows else 0.0
    spread_head, spread_rule = (" spread (CoV) |", "---:|") if rounds is not None else ("", "")
    lines = [
        f"| config | items/s | vs base |{spread_head} p50 ms | p99 ms | busiest resource (traced) | busy "
        "| bound items/s | copy hidden |",
        f"|---|---:|---:|{spread_rule}---:|---:|---|---:|---:|---:|",
    ]
    flagged = False
    for i, (timed, traced) in enumerate(rows):
        if rounds is not None:
            speedup = format_ratio(rounds[i], rounds[baseline])
            r = rounds[i]
            spread = f" {r.stats.min:.1f}-{r.stats.max:.1f} ({r.stats.cov:.1f}%) |"
        else:
            speedup = f"{timed.items_per_s / base:.2f}x" if base > 0 else "-"
            spread = ""
        neck = traced.bottleneck if traced is not None else None
        bound = traced.bound_items_per_s if traced is not None else None
        bound_text = "-" if bound is None else f"{bound:.1f}"
        if bound is not None and bound < timed.items_per_s:
            bound_text += f" {BOUND_FLAG}"
            flagged = True
        lines.append(
            f"| {timed.label} | {timed.items_per_s:.1f} | {speedup} |{spread} "
            f"{timed.latency_ms.get('p50', float('nan')):.2f} | {timed.latency_ms.get('p99', float('nan')):.2f} "
            f"| {neck[0] if neck else '-'} | {_pct(neck[1] if neck else None)} "
            f"| {bound_text} "
            f"| {_pct(traced.copy_hidden if traced is not None else None)} |"
        )
    if flagged:
        lines.append("")
        lines.append(f"{BOUND_FLAG} bound below the measured items/s: the traced run was slower than the timed "
                     "rounds (tracing overhead or noise during it), so its busy fraction overstates the load; "
                     "the real bound is higher.")
    return "\n".join(lines)
