"""Per-layer (per-node) profiles: where an engine's time goes, sorted, with each node's share.

The timings come from the backend's own profiler (:meth:`Engine.profile_layers`), in a run
separate from timed benchmark runs because profilers slow execution down (TensorRT's IProfiler
makes enqueue synchronous; ONNX Runtime writes a trace event per node). Shares are of the sum
of node times, so they add up to 100 % even though the sum is not the wall time of a query.

Example:
    >>> profile = LayerProfile.from_timings(engine.profile_layers(feeds, 10), iterations=10)  # doctest: +SKIP
    >>> print(profile.format(top=15))                                                         # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from streamrt.backends.base import LayerTiming

__all__ = ["LayerProfile", "LayerRow", "OpTypeRow"]


@dataclass(frozen=True)
class LayerRow:
    """One node: total time over the profiled iterations, calls, and share of the total (percent)."""

    name: str
    op_type: str
    total_ms: float
    calls: int
    per_iteration_ms: float
    share: float
    cumulative: float

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op_type": self.op_type,
            "total_ms": self.total_ms,
            "calls": self.calls,
            "per_iteration_ms": self.per_iteration_ms,
            "share_percent": self.share,
            "cumulative_percent": self.cumulative,
        }


@dataclass(frozen=True)
class OpTypeRow:
    """All nodes of one op type together."""

    op_type: str
    nodes: int
    total_ms: float
    share: float

    def to_json(self) -> dict[str, Any]:
        return {
            "op_type": self.op_type,
            "nodes": self.nodes,
            "total_ms": self.total_ms,
            "share_percent": self.share,
        }


@dataclass(frozen=True)
class LayerProfile:
    """A sorted per-node profile (slowest first).

    Attributes:
        rows: every node that took time, slowest first.
        iterations: how many queries were profiled.
        total_ms: sum of all node times over all iterations.
    """

    rows: tuple[LayerRow, ...]
    iterations: int
    total_ms: float

    @classmethod
    def from_timings(cls, timings: Iterable[LayerTiming], iterations: int) -> LayerProfile:
        """Sort ``timings`` by total time and compute shares; nodes with no time are dropped."""
        items = sorted((t for t in timings if t.total_ms > 0), key=lambda t: t.total_ms, reverse=True)
        total = sum(t.total_ms for t in items)
        rows = []
        running = 0.0
        for t in items:
            share = t.total_ms / total * 100.0 if total else 0.0
            running += share
            rows.append(
                LayerRow(t.name, t.op_type, t.total_ms, t.calls, t.total_ms / max(iterations, 1), share, running)
            )
        return cls(tuple(rows), iterations, total)

    @property
    def per_iteration_ms(self) -> float:
        """Sum of node times per query."""
        return self.total_ms / max(self.iterations, 1)

    def by_op_type(self) -> list[OpTypeRow]:
        """Time per op type, largest first."""
        groups: dict[str, list[LayerRow]] = {}
        for row in self.rows:
            groups.setdefault(row.op_type, []).append(row)
        out = [
            OpTypeRow(op, len(rows), sum(r.total_ms for r in rows), sum(r.share for r in rows))
            for op, rows in groups.items()
        ]
        return sorted(out, key=lambda r: r.total_ms, reverse=True)

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        rows = self.rows[:top] if top else self.rows
        return {
            "iterations": self.iterations,
            "total_ms": self.total_ms,
            "per_iteration_ms": self.per_iteration_ms,
            "nodes": len(self.rows),
            "layers": [r.to_json() for r in rows],
            "op_types": [r.to_json() for r in self.by_op_type()],
        }

    def format(self, top: int | None = None) -> str:
        """A table of the ``top`` slowest nodes (all by default), then a line for the rest and the total."""
        shown = self.rows[:top] if top else self.rows
        header = ("#", "node", "op", "ms/iter", "total ms", "calls", "share", "cumul.")
        table = [header] + [
            (
                str(i),
                r.name,
                r.op_type,
                f"{r.per_iteration_ms:.4f}",
                f"{r.total_ms:.3f}",
                str(r.calls),
                f"{r.share:5.1f}%",
                f"{r.cumulative:5.1f}%",
            )
            for i, r in enumerate(shown, 1)
        ]
        rest = self.rows[len(shown) :]
        if rest:
            rest_ms = sum(r.total_ms for r in rest)
            rest_share = sum(r.share for r in rest)
            table.append(
                (
                    "",
                    f"({len(rest)} more nodes)",
                    "",
                    f"{rest_ms / max(self.iterations, 1):.4f}",
                    f"{rest_ms:.3f}",
                    "",
                    f"{rest_share:5.1f}%",
                    "100.0%",
                )
            )
        table.append(
            (
                "",
                "total",
                "",
                f"{self.per_iteration_ms:.4f}",
                f"{self.total_ms:.3f}",
                "",
                "100.0%" if self.rows else "0.0%",
                "",
            )
        )
        right = {0, 3, 4, 5, 6, 7}
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        lines = [
            f"=== Per-node profile ({self.iterations} iterations, {len(self.rows)} nodes) ===",
            *(
                "  ".join(
                    c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
                ).rstrip()
                for row in table
            ),
            "",
            "By op type: " + ", ".join(f"{o.op_type} {o.share:.1f}% ({o.nodes})" for o in self.by_op_type()),
        ]
        return "\n".join(lines)
