"""Kernel tables from a torch.profiler (Kineto) Chrome trace: which kernels take the time.

:func:`trace_events` reads the complete events (``"ph": "X"``) of the chosen categories from the
JSON that ``prof.export_chrome_trace`` writes: on a GPU the device-side ``kernel``,
``gpu_memcpy`` and ``gpu_memset`` events, which carry the kernel names and their durations on the
GPU clock; on a CPU ``cpu_op`` events. Events on one track (a CPU thread) nest; each event counts
only its self time (its duration minus its direct children's), so the shares of a table add up to
100 % of the busy time instead of counting a parent and its children twice. Kernels on a CUDA
stream never nest, so their self time is their duration.

:class:`KernelTable` groups events by name, slowest first, and tags each with a kind
(:func:`classify_kernel`): ``matmul/conv`` (cuBLAS, cuDNN, CUTLASS and Inductor's Triton
templates: the kernels that carry the model's FLOPs), ``attention``, ``pointwise`` and
``reduction`` (Inductor's fused Triton kernels and ATen's), ``layout`` (NCHW <-> NHWC
transforms), ``memcpy``, ``memset`` and ``other``. Bytes are known only for copies and memsets
(Kineto records them); a kernel's bytes are left blank rather than guessed.

Example:
    >>> trace = {"traceEvents": [
    ...     {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_relu_0", "pid": 0, "tid": 7,
    ...      "ts": 0.0, "dur": 10.0},
    ...     {"ph": "X", "cat": "kernel", "name": "sm90_xmma_fprop_implicit_gemm", "pid": 0, "tid": 7,
    ...      "ts": 12.0, "dur": 30.0}]}
    >>> table = KernelTable.from_events(trace_events(trace), iterations=1)
    >>> [(r.kind, round(r.share, 1)) for r in table.rows]
    [('matmul/conv', 75.0), ('pointwise', 25.0)]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CPU_CATEGORIES",
    "GPU_CATEGORIES",
    "KernelRow",
    "KernelTable",
    "KindRow",
    "TraceEvent",
    "classify_kernel",
    "self_times",
    "trace_events",
]

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
"""Device-side event categories of a Kineto trace."""
CPU_CATEGORIES = ("cpu_op",)
"""Host operator events of a Kineto trace."""

MATMUL = "matmul/conv"

# First match wins; names are matched lowercased. Inductor names its fused Triton kernels after the
# ops they contain ("triton_poi_fused_convolution_relu_3" is a pointwise epilogue, not a conv), so
# its prefixes come before the library patterns, and cuDNN's layout transforms before "cudnn".
_KIND_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("pointwise", re.compile(r"\btriton_poi_")),
    ("reduction", re.compile(r"\btriton_(red|per)_")),
    (MATMUL, re.compile(r"\btriton_tem_|\btriton_(b)?mm")),
    ("attention", re.compile(r"flash|fmha|attention|sdpa")),
    ("layout", re.compile(r"nchwtonhwc|nhwctonchw|transpose|permute")),
    (MATMUL, re.compile(r"gemm|gemv|conv|fprop|dgrad|wgrad|xmma|cutlass|cudnn|cublas|winograd|splitkreduce"
                        r"|s16816|s1688|s884|hmma|wgmma|implicit")),
    ("pointwise", re.compile(r"elementwise|vectorized|unrolled|copy_kernel|fill_kernel|\btriton_")),
    ("reduction", re.compile(r"reduce|softmax|norm|pool|scan|topk|sort")),
)


def classify_kernel(name: str, category: str = "kernel") -> str:
    """The kind of a kernel (see the module docs) from its name and trace category."""
    if category == "gpu_memcpy":
        return "memcpy"
    if category == "gpu_memset":
        return "memset"
    if category == "cpu_op":
        return "op"
    lowered = name.lower()
    for kind, pattern in _KIND_PATTERNS:
        if pattern.search(lowered):
            return kind
    return "other"


@dataclass(frozen=True)
class TraceEvent:
    """One complete event of a trace: times in microseconds, bytes where the trace gives them."""

    name: str
    category: str
    track: tuple[str, str]
    start_us: float
    duration_us: float
    bytes: int | None = None


def trace_events(trace: Mapping[str, Any], categories: Sequence[str] = GPU_CATEGORIES) -> list[TraceEvent]:
    """The complete events of ``categories`` in a Chrome trace (a parsed ``export_chrome_trace`` file)."""
    wanted = set(categories)
    out = []
    for event in trace.get("traceEvents", ()):
        if event.get("ph") != "X" or event.get("cat") not in wanted:
            continue
        args = event.get("args") or {}
        size = args.get("bytes")
        out.append(
            TraceEvent(
                str(event.get("name", "")),
                str(event["cat"]),
                (str(event.get("pid", "")), str(event.get("tid", ""))),
                float(event.get("ts", 0.0)),
                max(float(event.get("dur", 0.0)), 0.0),
                int(size) if isinstance(size, (int, float)) and size >= 0 else None,
            )
        )
    return out


def self_times(events: Sequence[TraceEvent]) -> list[float]:
    """Each event's duration minus its direct children's on the same track (never below zero)."""
    self_us = [e.duration_us for e in events]
    by_track: dict[tuple[str, str], list[int]] = {}
    for i, e in enumerate(events):
        by_track.setdefault(e.track, []).append(i)
    for indices in by_track.values():
        indices.sort(key=lambda i: (events[i].start_us, -events[i].duration_us))
        stack: list[int] = []  # open events, innermost last
        for i in indices:
            start = events[i].start_us
            while stack and events[stack[-1]].start_us + events[stack[-1]].duration_us <= start:
                stack.pop()
            if stack:
                self_us[stack[-1]] -= events[i].duration_us
            stack.append(i)
    return [max(t, 0.0) for t in self_us]


@dataclass(frozen=True)
class KernelRow:
    """All launches of one kernel (or calls of one op): self time in microseconds over the profile."""

    name: str
    kind: str
    calls: int
    total_us: float
    share: float
    bytes: int | None
    iterations: int

    @property
    def mean_us(self) -> float:
        return self.total_us / max(self.calls, 1)

    @property
    def calls_per_iteration(self) -> float:
        return self.calls / max(self.iterations, 1)

    @property
    def gb_per_s(self) -> float | None:
        """Achieved bandwidth where the trace gives the bytes (copies and memsets)."""
        if self.bytes is None or self.total_us <= 0:
            return None
        return self.bytes / (self.total_us * 1e3)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "calls": self.calls,
            "calls_per_iteration": self.calls_per_iteration,
            "total_ms": self.total_us / 1e3,
            "mean_us": self.mean_us,
            "share_percent": self.share,
            "bytes": self.bytes,
            "gb_per_s": self.gb_per_s,
        }


@dataclass(frozen=True)
class KindRow:
    """All kernels of one kind."""

    kind: str
    kernels: int
    calls: int
    total_us: float
    share: float


@dataclass(frozen=True)
class KernelTable:
    """Kernels (or ops) by self time, slowest first.

    Attributes:
        rows: one row per distinct name.
        iterations: profiled queries.
        total_us: summed self time of every row over all iterations.
    """

    rows: tuple[KernelRow, ...]
    iterations: int
    total_us: float

    @classmethod
    def from_events(cls, events: Sequence[TraceEvent], iterations: int) -> KernelTable:
        """Group ``events`` by name with their self times (:func:`self_times`) and shares."""
        times = self_times(events)
        groups: dict[str, list[tuple[TraceEvent, float]]] = {}
        for event, t in zip(events, times, strict=True):
            groups.setdefault(event.name, []).append((event, t))
        total = sum(times)
        rows = []
        for name, items in groups.items():
            spent = sum(t for _, t in items)
            sizes = [e.bytes for e, _ in items]
            rows.append(
                KernelRow(
                    name,
                    classify_kernel(name, items[0][0].category),
                    len(items),
                    spent,
                    spent / total * 100.0 if total > 0 else 0.0,
                    sum(s for s in sizes if s is not None) if all(s is not None for s in sizes) else None,
                    iterations,
                )
            )
        rows.sort(key=lambda r: r.total_us, reverse=True)
        return cls(tuple(rows), iterations, total)

    @property
    def per_iteration_ms(self) -> float:
        """Busy time per query (summed self times / iterations)."""
        return self.total_us / max(self.iterations, 1) / 1e3

    def by_kind(self) -> list[KindRow]:
        """Time per kind, largest first."""
        groups: dict[str, list[KernelRow]] = {}
        for row in self.rows:
            groups.setdefault(row.kind, []).append(row)
        out = [
            KindRow(kind, len(rows), sum(r.calls for r in rows), sum(r.total_us for r in rows),
                    sum(r.share for r in rows))
            for kind, rows in groups.items()
        ]
        return sorted(out, key=lambda r: r.total_us, reverse=True)

    def kind_ms_per_iteration(self, kind: str) -> float:
        return sum(r.total_us for r in self.rows if r.kind == kind) / max(self.iterations, 1) / 1e3

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        rows = self.rows[:top] if top else self.rows
        return {
            "iterations": self.iterations,
            "distinct_kernels": len(self.rows),
            "kernel_ms_per_iteration": self.per_iteration_ms,
            "kernels": [r.to_json() for r in rows],
            "kernel_kinds": [
                {"kind": k.kind, "kernels": k.kernels, "calls": k.calls, "total_ms": k.total_us / 1e3,
                 "share_percent": k.share}
                for k in self.by_kind()
            ],
        }

    def format(self, top: int | None = None, width: int = 64) -> str:
        """The ``top`` slowest kernels (all by default), a line for the rest, and the total."""
        shown = self.rows[:top] if top else self.rows
        header = ("#", "kernel", "kind", "time %", "calls/iter", "mean us", "total ms", "GB/s")
        table: list[tuple[str, ...]] = [header]
        for i, r in enumerate(shown, 1):
            gbs = r.gb_per_s
            table.append((str(i), _shorten(r.name, width), r.kind, f"{r.share:5.1f}%", f"{r.calls_per_iteration:g}",
                          f"{r.mean_us:.1f}", f"{r.total_us / 1e3:.3f}", f"{gbs:.0f}" if gbs is not None else ""))
        rest = self.rows[len(shown):]
        if rest:
            rest_us = sum(r.total_us for r in rest)
            table.append(("", f"({len(rest)} more kernels)", "", f"{sum(r.share for r in rest):5.1f}%",
                          f"{sum(r.calls for r in rest) / max(self.iterations, 1):g}", "", f"{rest_us / 1e3:.3f}", ""))
        table.append(("", "total", "", "100.0%" if self.rows else "0.0%",
                      f"{sum(r.calls for r in self.rows) / max(self.iterations, 1):g}", "",
                      f"{self.total_us / 1e3:.3f}", ""))
        lines = [
            f"=== Kernels ({self.iterations} iterations, {len(self.rows)} distinct, "
            f"{self.per_iteration_ms:.4f} ms busy per iteration) ===",
            *_align(table, right={0, 3, 4, 5, 6, 7}),
        ]
        return "\n".join(lines)


def _shorten(name: str, width: int) -> str:
    """A kernel name cut to ``width`` characters (template arguments go first)."""
    plain = re.sub(r"^void\s+", "", name)
    if len(plain) > width:
        plain = re.sub(r"<.*", "<...>", plain)
    return plain if len(plain) <= width else plain[: width - 3] + "..."


def _align(table: Iterable[tuple[str, ...]], right: set[int]) -> list[str]:
    rows = list(table)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        .rstrip()
        for row in rows
    ]
