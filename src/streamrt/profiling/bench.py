"""trtexec-style benchmarks of an engine: warm-up, timed queries, performance summary, warnings.

One *query* is one ``infer`` call on one batch. Every query gets a record with trtexec's
timestamps (enqueue, H2D, compute and D2H start/end, in ms from the start of the run); the
summary gives throughput (queries/s and items/s), min/max/mean/median/p90/p95/p99 of each
metric (:mod:`streamrt.measure.stats`), total host walltime and total compute time, and
trtexec's warnings.

How each kind of engine is timed:

- **CPU engines** (``engine.device_kind == "cpu"``): inputs and outputs live in host memory, so H2D
  and D2H are zero-length. Compute is the host time of the ``infer`` call, which on a CPU
  engine is synchronous, so enqueue time equals compute time and the enqueue-bound check
  does not apply.
- **CUDA engines** (``engine.device_kind == "cuda"``): inputs start in pinned host memory and are
  copied with ``non_blocking=True`` on a dedicated ``torch.cuda.Stream`` (never the default
  stream); H2D, compute and D2H are measured with ``torch.cuda.Event(enable_timing=True)`` on
  that stream; enqueue is the host time of the ``infer`` call. As in trtexec, the next query is
  enqueued before the previous one is waited for, so the host and the GPU overlap.

Metric definitions follow trtexec: latency = H2D + compute + D2H; total host walltime runs from
the first timed enqueue to the last completion; throughput = queries / walltime.

Example:
    >>> result = benchmark(engine, feeds, warmup_ms=200, duration_s=3)   # doctest: +SKIP
    >>> print(result.format())                                           # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from streamrt.measure.stats import Stats
from streamrt.profiling.loops import BenchSettings, TimedRun, host_loop
from streamrt.profiling.summary import (
    COV_THRESHOLD,
    ENQUEUE_BOUND_RATIO,
    BenchSummary,
    BenchWarning,
    IterationRecord,
    check_warnings,
)
from streamrt.running.inputs import batch_size, shapes_of
from streamrt.types import Shape, format_shape

if TYPE_CHECKING:
    from streamrt.backends.base import Engine

__all__ = [
    "COV_THRESHOLD",
    "ENQUEUE_BOUND_RATIO",
    "BenchResult",
    "BenchSettings",
    "BenchSummary",
    "BenchWarning",
    "IterationRecord",
    "TimedRun",
    "benchmark",
    "benchmark_function",
    "check_warnings",
]

log = logging.getLogger(__name__)

_CPU_NOTE = (
    "CPU engine: inputs and outputs stay in host memory, so H2D and D2H are zero-length; compute and "
    "enqueue are both the host time of the synchronous infer call (the enqueue-bound check does not apply)."
)
_CUDA_NOTE = (
    "CUDA engine: H2D (pinned, non_blocking), compute and D2H timed with CUDA events on a dedicated stream; "
    "enqueue is the host time of the infer call."
)


@dataclass(frozen=True)
class BenchResult:
    """A finished benchmark: per-query records, summary, warnings, and how it was run.

    Example:
        >>> result.summary.throughput_qps                       # doctest: +SKIP
        >>> result.write_times("times.json")                    # doctest: +SKIP
    """

    label: str
    device: str
    shapes: Mapping[str, Shape]
    settings: BenchSettings
    warmup_queries: int
    warmup_elapsed_ms: float
    records: tuple[IterationRecord, ...]
    summary: BenchSummary
    warnings: tuple[BenchWarning, ...]
    info: Mapping[str, str] = field(default_factory=dict)

    @property
    def notes(self) -> tuple[str, ...]:
        return (_CUDA_NOTE,) if self.device == "cuda" else (_CPU_NOTE,)

    def export_times(self) -> list[dict[str, float]]:
        """Per-query records with trtexec's ``--exportTimes`` field names."""
        return [r.to_json() for r in self.records]

    def write_times(self, path: str | Path) -> Path:
        """Write :meth:`export_times` as a JSON array, one query per line (as trtexec writes it)."""
        p = Path(path)
        rows = ",\n".join(f"  {json.dumps(r)}" for r in self.export_times())
        p.write_text(f"[\n{rows}\n]\n")
        return p

    def to_json(self) -> dict[str, Any]:
        """Everything but the per-query records (see :meth:`export_times`)."""
        return {
            "engine": self.label,
            "device": self.device,
            "shapes": {name: list(shape) for name, shape in self.shapes.items()},
            **dict(self.info),
            "settings": {
                "warmup_ms": self.settings.warmup_ms,
                "duration_s": self.settings.duration_s,
                "iterations": self.settings.iterations,
            },
            "warmup_queries": self.warmup_queries,
            "summary": self.summary.to_json(),
            "warnings": [w.to_json() for w in self.warnings],
            "notes": list(self.notes),
        }

    def format(self) -> str:
        """A trtexec-like report ending in its ``=== Performance summary ===`` block."""
        s = self.summary
        shapes = ", ".join(f"{n}={format_shape(v)}" for n, v in self.shapes.items())
        unit = "GPU" if self.device == "cuda" else "CPU"
        lines = [
            "=== Benchmark ===",
            f"Engine: {self.label}",
            f"Device: {self.device}",
            f"Shapes: {shapes} (batch {s.batch})",
            *(f"{key.capitalize()}: {value}" for key, value in self.info.items()),
            f"Warmup completed {self.warmup_queries} queries over {self.warmup_elapsed_ms:.6g} ms",
            f"Timing trace has {s.queries} queries over {s.walltime_s:.6g} s",
            "",
            "=== Performance summary ===",
            f"Throughput: {s.throughput_qps:.6g} qps, {s.items_per_s:.6g} items/s (batch {s.batch})",
            f"Latency: {s.latency.format()}",
            f"Enqueue Time: {s.enqueue.format()}",
            f"H2D Latency: {self._transfer(s.h2d)}",
            f"{unit} Compute Time: {s.compute.format()}",
            f"D2H Latency: {self._transfer(s.d2h)}",
            f"Total Host Walltime: {s.walltime_s:.6g} s",
            f"Total {unit} Compute Time: {s.total_compute_s:.6g} s",
        ]
        lines += [f"Note: {note}" for note in self.notes]
        if self.warnings:
            lines.append("Warnings:")
            for w in self.warnings:
                lines += [f"* {w.message}.", f"  What to do: {w.advice}."]
        return "\n".join(lines)

    def _transfer(self, stats: Stats) -> str:
        if self.device != "cuda" and stats.max == 0.0:
            return "0 ms (zero-length: CPU engine, no transfer)"
        return stats.format()


# --- run loops ---------------------------------------------------------------------------------

def _label(engine: Engine) -> str:
    m = engine.manifest
    return f"{m.source_name} ({m.backend} {m.backend_version}, {m.precision})"


def _finish(
    label: str,
    device: str,
    shapes: Mapping[str, Shape],
    settings: BenchSettings,
    batch: int,
    run: TimedRun,
    info: Mapping[str, str] | None,
) -> BenchResult:
    summary = BenchSummary.from_records(run.records, run.walltime_s, batch)
    warnings = tuple(check_warnings(summary, device))
    log.debug("benchmark %s: %d queries, %.2f qps", label, summary.queries, summary.throughput_qps)
    return BenchResult(
        label,
        device,
        dict(shapes),
        settings,
        run.warmup_queries,
        run.warmup_ms,
        tuple(run.records),
        summary,
        warnings,
        dict(info or {}),
    )


def benchmark(
    engine: Engine,
    inputs: Mapping[str, np.ndarray],
    *,
    warmup_ms: float = 200.0,
    duration_s: float = 3.0,
    iterations: int = 10,
    batch: int | None = None,
    label: str | None = None,
    info: Mapping[str, str] | None = None,
) -> BenchResult:
    """Benchmark ``engine`` on host ``inputs`` (see module docs for how CPU and CUDA engines are timed).

    Args:
        engine: a loaded engine.
        inputs: NumPy arrays by input name (fresh random data or loaded, never zeros).
        warmup_ms: run untimed queries for this long first.
        duration_s: run timed queries for at least this long...
        iterations: ...and at least this many (trtexec's ``--duration`` and ``--iterations``).
        batch: items per query; defaults to the leading dimension of the dynamic-batch input.
        label: how the report names the engine (default: source model, backend, precision).
        info: extra ``key: value`` lines for the report and JSON (e.g. where inputs came from).

    Raises:
        InputError: inputs do not match the engine.
        ConfigError: bad settings.
    """
    settings = BenchSettings(warmup_ms, duration_s, iterations)
    engine.validate(inputs)
    shapes = shapes_of(inputs)
    items = batch if batch is not None else batch_size(engine.inputs, shapes)
    name = label or _label(engine)
    info = dict(info or {})
    with engine.create_context() as ctx:
        if engine.device_kind == "cuda":
            from streamrt.profiling.cuda_timing import cuda_loop
            from streamrt.profiling.launches import describe_launches

            launches = describe_launches(engine, inputs, bool(getattr(ctx, "cuda_graph", False)))
            if launches is not None:
                info.setdefault("kernels", launches)

            run = cuda_loop(ctx, inputs, settings)
        else:
            feeds = dict(inputs)
            run = host_loop(lambda: ctx.infer(feeds), settings)
    return _finish(name, engine.device_kind, shapes, settings, items, run, info)


def benchmark_function(
    fn: Callable[[], Any],
    *,
    label: str,
    shapes: Mapping[str, Shape] | None = None,
    batch: int = 1,
    warmup_ms: float = 200.0,
    duration_s: float = 3.0,
    iterations: int = 10,
    info: Mapping[str, str] | None = None,
) -> BenchResult:
    """Time any synchronous host callable exactly as a CPU engine is timed (e.g. a baseline session).

    Example:
        >>> benchmark_function(lambda: session.run(None, feeds), label="ort", batch=8)  # doctest: +SKIP
    """
    settings = BenchSettings(warmup_ms, duration_s, iterations)
    return _finish(label, "cpu", shapes or {}, settings, batch, host_loop(fn, settings), info)
