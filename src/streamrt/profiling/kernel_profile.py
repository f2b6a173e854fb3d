"""Profile a CUDA engine's kernels and time its queries: the data behind ``streamrt profile`` on GPU plans.

Two runs, because a profiler changes what it measures:

1. **Kernel trace**: a context *without* CUDA graphs (each kernel launched by the runner, so the
   trace ties every kernel to the query) runs one warm-up query outside the profiler, then
   ``iterations`` queries under ``torch.profiler`` with CPU and CUDA activities. The Chrome trace
   it exports gives the kernel names and their GPU durations (:mod:`streamrt.profiling.kernels`).
   Kernel durations do not depend on how they were launched; the launch gaps do, which is why
   the time of a query comes from the second run.
2. **Timed queries**: the plan's default context (CUDA graphs when the plan uses them), a few
   warm-up queries (the first one captures the graph), then ``timed_runs`` queries each between
   two CUDA events on the current stream; the median is the query time the roofline uses.

Works for any engine whose context runs on torch's current CUDA stream (torch_inductor, TensorRT).
"""

from __future__ import annotations

import inspect
import json
import statistics
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrt.profiling.kernels import GPU_CATEGORIES, KernelTable, trace_events

__all__ = ["KernelProfile", "profile_cuda_kernels", "time_cuda_queries"]


@dataclass(frozen=True)
class KernelProfile:
    """A kernel table and the measured time of one query.

    Attributes:
        table: kernels of the profiled queries, slowest first.
        wall_ms: median CUDA-event time of one query in the timed run.
        graphs: whether the timed run replayed CUDA graphs.
        timed_runs: queries in the timed run.
        trace: the Chrome trace the table was read from.
    """

    table: KernelTable
    wall_ms: float
    graphs: bool
    timed_runs: int
    trace: Mapping[str, Any]

    @property
    def timing(self) -> str:
        return f"median of {self.timed_runs} CUDA-event timed queries{', CUDA graphs' if self.graphs else ''}"


def _context(engine: Any, cuda_graph: bool | None) -> Any:
    params = inspect.signature(engine.create_context).parameters
    if "cuda_graph" in params:
        return engine.create_context(cuda_graph=cuda_graph)
    return engine.create_context()


def time_cuda_queries(ctx: Any, inputs: Mapping[str, Any], runs: int, warmup: int = 3) -> list[float]:
    """CUDA-event times (ms) of ``runs`` queries on the current stream, after ``warmup`` queries."""
    import torch

    stream = torch.cuda.current_stream()
    for _ in range(warmup):
        ctx.infer(inputs, stream)
    stream.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        ctx.infer(inputs, stream)
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def profile_cuda_kernels(
    engine: Any,
    inputs: Mapping[str, Any],
    iterations: int,
    *,
    timed_runs: int = 50,
    trace_path: str | Path | None = None,
) -> KernelProfile:
    """Trace ``iterations`` queries' kernels, then time ``timed_runs`` queries (see the module docs).

    ``inputs`` are device tensors by input name. ``trace_path`` keeps the Chrome trace (it opens
    in Perfetto); otherwise it is written to a temporary file and removed.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    plain = _context(engine, cuda_graph=False)
    plain.infer(inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            plain.infer(inputs)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory(prefix="streamrt-trace-") as tmp:
        path = Path(trace_path) if trace_path is not None else Path(tmp) / "trace.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    plain.close()
    table = KernelTable.from_events(trace_events(trace, GPU_CATEGORIES), iterations)

    ctx = _context(engine, cuda_graph=None)
    graphs = bool(getattr(ctx, "cuda_graph", False))
    times = time_cuda_queries(ctx, inputs, timed_runs)
    ctx.close()
    return KernelProfile(table, statistics.median(times), graphs, timed_runs, trace)
