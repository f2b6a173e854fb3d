"""The cyclic garbage collector's pauses while a block runs: how many collections of each generation, how long.

A full collection walks every tracked object of the process and holds the GIL meanwhile: with torch, ONNX Runtime
and a model loaded (~180,000 objects) one took ~50-100 ms on the CPU machine, every thread of the process stopped.
In a camera pipeline whose streams queue two frames (66 ms at 30 FPS) that is enough to drop a frame on many
streams at once. Recording the pauses of a run says whether they happened, instead of guessing:

    >>> import gc
    >>> from streamrt.profiling.gc_pauses import GcPauses
    >>> with GcPauses() as pauses:
    ...     _ = gc.collect()
    >>> pauses.count(2) >= 1
    True
"""

from __future__ import annotations

import gc
import time
from types import TracebackType
from typing import Any

__all__ = ["GcPauses"]


class GcPauses:
    """Collections started and finished while the ``with`` block runs (``gc.callbacks``), any thread."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self._started: float | None = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.pauses.append((int(info["generation"]), time.perf_counter() - self._started))
            self._started = None

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        gc.callbacks.remove(self._callback)

    def count(self, generation: int) -> int:
        return sum(1 for g, _ in self.pauses if g == generation)

    def longest_ms(self, generation: int | None = None) -> float:
        return max((s for g, s in self.pauses if generation is None or g == generation), default=0.0) * 1e3

    def summary(self) -> str:
        """One line: full collections and their longest pause, the young ones (generations 0 and 1) and theirs,
        then every generation's total."""
        total = sum(s for _, s in self.pauses) * 1e3
        young = max(self.longest_ms(0), self.longest_ms(1))
        return (f"full collections: {self.count(2)} (longest {self.longest_ms(2):.1f} ms); young ones: "
                f"{self.count(0) + self.count(1)} (longest {young:.1f} ms); {total:.0f} ms paused in all")
