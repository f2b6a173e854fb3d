"""Level 5's memory-format choice: compile both layouts, time them at the opt shape, keep the faster.

A graph with convolutions is compiled twice, once with Inductor's layout optimization forced
(channels-last activations and weights inside the plan) and once with it off (contiguous NCHW);
plans take and return the same tensors either way. Each package is loaded and timed on the
exported example inputs (the profile's opt shapes): the median of repeated runs, timed with CUDA
events on a GPU and ``perf_counter`` on the CPU. A graph without convolutions keeps Inductor's
heuristic: there is nothing to choose.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["LayoutChoice", "choose_memory_format", "has_convolutions", "median_ms"]

_WARMUP = 3
_RUNS = 20


@dataclass(frozen=True)
class LayoutChoice:
    """The decided memory format, its package and what each candidate measured (ms, median)."""

    memory_format: str
    package: bytes
    timings_ms: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"memory_format": self.memory_format, "timings_ms": dict(self.timings_ms)}


def has_convolutions(ep: torch.export.ExportedProgram) -> bool:
    """Whether the exported graph convolves (``aten.conv2d``, ``aten.convolution``, ``aten.conv_transpose2d``...)."""
    return any(
        node.op == "call_function" and str(node.target).startswith(("aten.conv", "aten._convolution"))
        for node in ep.graph.nodes
    )


def median_ms(run: Callable[[], Any], device: str, runs: int = _RUNS) -> float:
    """Median milliseconds of ``runs`` calls after warm-up: CUDA events on a GPU, perf_counter on the CPU."""
    for _ in range(_WARMUP):
        run()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(runs):
            begin = time.perf_counter()
            run()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def _time_package(package: bytes, inputs: tuple[Any, ...], device: str) -> float:
    from streamrt.backends.torch_inductor.engine import ensure_cxx_runtime
    from streamrt.backends.torch_inductor.nogil_runner import open_torch_runner

    ensure_cxx_runtime()
    with tempfile.TemporaryDirectory(prefix="streamrt-layout-") as tmp:
        path = Path(tmp) / "candidate.pt2"
        path.write_bytes(package)
        index = torch.cuda.current_device() if device == "cuda" else -1
        runner = open_torch_runner(path, index)
        with torch.no_grad():
            return median_ms(lambda: runner(*inputs), device)


def choose_memory_format(
    ep: torch.export.ExportedProgram,
    compile_with: Callable[[str, bool], bytes | None],
    device: str,
    progress: Callable[[str], None],
) -> LayoutChoice:
    """Compile ``ep`` in both layouts (``compile_with(memory_format, optional)``), time them, keep the faster.

    channels_last is compiled first; the contiguous candidate is optional: under a build budget
    that is spent, ``compile_with`` returns ``None`` and channels_last is kept unmeasured against it.
    """
    args, _ = ep.example_inputs
    inputs = tuple(args)
    packages: dict[str, bytes] = {}
    timings: dict[str, float] = {}
    for memory_format in ("channels_last", "contiguous"):
        progress(f"memory format: compiling and timing {memory_format}")
        package = compile_with(memory_format, bool(packages))
        if package is None:
            progress(f"memory format: {memory_format} not compiled (build budget spent)")
            continue
        packages[memory_format] = package
        timings[memory_format] = round(_time_package(package, inputs, device), 4)
    best = min(timings, key=lambda name: timings[name])
    progress(
        f"memory format: {best} ({', '.join(f'{k} {v:.3f} ms' for k, v in timings.items())} at the opt shape)"
    )
    return LayoutChoice(best, packages[best], timings)


