"""Run one workload through several pipeline configurations, side by side, in one process.

Each case builds its pipeline, warms it up (lazy initialisation, allocator growth, cuDNN
heuristics and CUDA-graph capture stay out of the measurement), then times ``items`` items fed
from a small pool of distinct inputs. Rounds interleave the cases (``a b c a b c ...``), so a
machine whose speed drifts (shared CI runners, clocks) affects every case alike; the median
round is reported. :mod:`streamrt.profiling.pipeline_summary` turns the traces into tables.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamrt.device.base import Device
from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.pipeline.executor import Pipeline
from streamrt.pipeline.stage import Workload
from streamrt.pipeline.tracing import PipelineTrace

__all__ = ["BenchCase", "CaseResult", "compare", "standard_cases"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchCase:
    """A named configuration: ``(a)`` sync, ``(b)`` stage-per-stream, ``(c)`` replicated workers."""

    name: str
    config: PipelineConfig

    @property
    def label(self) -> str:
        return f"{self.name} {self.config.describe()}"


@dataclass
class CaseResult:
    """Measurements of one case: one untraced trace per round, an optional traced run."""

    case: BenchCase
    rounds: list[PipelineTrace] = field(default_factory=list)
    traced: PipelineTrace | None = None
    outputs: list[Any] = field(default_factory=list)

    @property
    def median(self) -> PipelineTrace:
        """The round with the median throughput (the lower middle one for an even count of rounds)."""
        ordered = sorted(self.rounds, key=lambda t: t.items_per_s)
        return ordered[(len(ordered) - 1) // 2]

    @property
    def items_per_s(self) -> float:
        """Throughput of :attr:`median`: the figure the comparison table prints, so every line agrees."""
        return self.median.items_per_s if self.rounds else 0.0


def standard_cases(
    *, ring_size: int = 4, workers: Sequence[int] = (2, 4), graphs: Sequence[bool] = (False,)
) -> list[BenchCase]:
    """The issue's comparison: (a) sync, (b) streams, (c) single-stream workers, (b+c) both."""
    cases = []
    for g in graphs:
        cases.append(BenchCase("(a)", PipelineConfig(topology=Topology.SYNC, cuda_graphs=g)))
        cases.append(BenchCase("(b)", PipelineConfig(topology=Topology.STREAMS, ring_size=ring_size, cuda_graphs=g)))
        for w in workers:
            cases.append(BenchCase("(c)", PipelineConfig(topology=Topology.SINGLE, workers=w, ring_size=ring_size,
                                                         cuda_graphs=g)))
            cases.append(BenchCase("(b+c)", PipelineConfig(topology=Topology.STREAMS, workers=w,
                                                           ring_size=ring_size, cuda_graphs=g)))
    return cases


def _run(
    workload: Workload,
    config: PipelineConfig,
    device: Device,
    inputs: Sequence[Any],
    items: int,
    warmup: int,
    keep: int,
) -> tuple[PipelineTrace, list[Any]]:
    outputs: list[Any] = []
    with Pipeline.from_workload(workload, config, device=device) as pipe:
        for result in pipe.map(itertools.islice(itertools.cycle(inputs), warmup)):
            result.unwrap()
        pipe.reset_trace()
        for result in pipe.map(itertools.islice(itertools.cycle(inputs), items)):
            value = result.unwrap()  # a failed item is a broken benchmark, not a data point
            if len(outputs) < keep:
                outputs.append(value)
        return pipe.trace(), outputs


def compare(
    cases: Sequence[BenchCase],
    make_workload: Callable[[], Workload],
    device: Device,
    inputs: Sequence[Any],
    *,
    items: int,
    warmup: int,
    rounds: int = 3,
    warmup_rounds: int = 1,
    trace_items: int | None = None,
    keep_outputs: int = 0,
    on_round: Callable[[int, BenchCase, PipelineTrace], None] | None = None,
) -> list[CaseResult]:
    """Measure every case ``rounds`` times, interleaved, then once more with tracing.

    Args:
        cases: what to compare; the first is the baseline by convention.
        make_workload: builds a fresh workload per run (engine contexts are per lane anyway).
        device: where to run (its ``kind`` overrides each config's ``device``).
        inputs: distinct inputs, cycled.
        items, warmup: measured and warm-up items per run.
        rounds: untraced runs per case; throughput is their median.
        warmup_rounds: rounds of every case run first and discarded: the first runs in a process
            pay one-time costs that a per-run warm-up does not absorb (first-touch page faults of
            fresh memory, allocator growth, library initialisation).
        trace_items: items in the traced run (None: no traced run).
        keep_outputs: outputs kept from the first round, to check cases agree.
        on_round: progress callback.
    """
    results = [CaseResult(case) for case in cases]
    for r in range(-warmup_rounds, rounds):
        for result in results:
            config = result.case.config.replace(device=device.kind, trace=False)
            keep = keep_outputs if r == 0 else 0
            trace, outputs = _run(make_workload(), config, device, inputs, items, warmup, keep)
            trace.label = result.case.label
            logger.info("%s %s: %.1f items/s", "warm-up round" if r < 0 else f"round {r}", result.case.label,
                        trace.items_per_s)
            if r < 0:
                continue
            result.rounds.append(trace)
            result.outputs.extend(outputs)
            if on_round is not None:
                on_round(r, result.case, trace)
    if trace_items:
        for result in results:
            config = result.case.config.replace(device=device.kind, trace=True)
            result.traced, _ = _run(make_workload(), config, device, inputs, trace_items, warmup, 0)
            result.traced.label = result.case.label
    return results
