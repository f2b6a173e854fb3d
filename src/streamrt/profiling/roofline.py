"""The roofline of a profiled engine: counted FLOPs over measured time, against the device's peak.

Two levels, both honest about what is known:

* **Whole model**: FLOPs of one query (:mod:`streamrt.profiling.flops`) over the measured time
  of a query (median of CUDA-event timed runs, with CUDA graphs when the plan uses them), against
  the datasheet peak of the plan's precision (:mod:`streamrt.profiling.peaks`).
* **By kernel kind**: every counted FLOP is done by a convolution, a matrix product or an
  attention op, so the FLOPs go to the ``matmul/conv`` kernels (and fused-attention ops' FLOPs to
  ``attention`` kernels when the profile has any), and their summed kernel time gives an achieved
  rate. Which single kernel did which FLOPs is not known from a trace, so per-kernel rows get no
  rate. Inductor sometimes lowers a tiny matrix product to a pointwise kernel; those few FLOPs
  are then credited to the ``matmul/conv`` kernels (a slight overstatement, said in the output).

An unknown device gets no peak column (``peaks is None``); an unknown FLOP count leaves the
rates blank.

Example:
    >>> from streamrt.profiling.flops import FlopCount
    >>> from streamrt.profiling.peaks import peaks_for
    >>> r = Roofline(FlopCount(8_200_000_000 * 32, {"convolution": 8_200_000_000 * 32}, 32),
    ...              peaks_for("NVIDIA H200"), "fp16", wall_ms=2.116, kernel_ms=2.0)
    >>> round(r.achieved_tflops, 1), round(100 * r.fraction_of_peak, 1)
    (124.0, 12.5)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamrt.profiling.flops import FlopCount
from streamrt.profiling.kernels import MATMUL, KernelTable
from streamrt.profiling.peaks import DevicePeaks, peak_precision

__all__ = ["KindRate", "Roofline", "format_kind_rates", "kind_rates"]


@dataclass(frozen=True)
class KindRate:
    """FLOPs credited to one kernel kind and the rate its kernels reached."""

    kind: str
    ms_per_iteration: float
    flops_per_iteration: int
    peak_tflops: float | None

    @property
    def tflops(self) -> float | None:
        if self.ms_per_iteration <= 0:
            return None
        return self.flops_per_iteration / (self.ms_per_iteration * 1e9)

    @property
    def fraction_of_peak(self) -> float | None:
        if self.tflops is None or not self.peak_tflops:
            return None
        return self.tflops / self.peak_tflops

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "ms_per_iteration": self.ms_per_iteration,
            "flops_per_iteration": self.flops_per_iteration,
            "tflops": self.tflops,
            "fraction_of_peak": self.fraction_of_peak,
        }


def kind_rates(table: KernelTable, flops: FlopCount | None, peak_tflops: float | None) -> list[KindRate]:
    """The FLOPs of one query credited to kernel kinds (see the module docs); empty when unknown."""
    if flops is None or flops.total <= 0:
        return []
    attention = flops.attention if table.kind_ms_per_iteration("attention") > 0 else 0
    credited = {MATMUL: flops.total - attention, "attention": attention}
    out = []
    for kind, n in credited.items():
        ms = table.kind_ms_per_iteration(kind)
        if n > 0 and ms > 0:
            out.append(KindRate(kind, ms, n, peak_tflops))
    return out


@dataclass(frozen=True)
class Roofline:
    """Whole-model roofline of one query.

    Attributes:
        flops: FLOPs of one query, or ``None`` when not counted.
        peaks: the device's peaks, or ``None`` for an unknown device.
        precision: the plan's precision (picks the peak column).
        wall_ms: measured time of one query (median), or ``None``.
        kernel_ms: summed kernel time of one query from the profile.
        timing: how ``wall_ms`` was measured, for the report line.
    """

    flops: FlopCount | None
    peaks: DevicePeaks | None
    precision: str
    wall_ms: float | None
    kernel_ms: float
    timing: str = ""

    @property
    def peak_tflops(self) -> float | None:
        return self.peaks.tflops(self.precision) if self.peaks is not None else None

    @property
    def achieved_tflops(self) -> float | None:
        if self.flops is None or not self.wall_ms:
            return None
        return self.flops.total / (self.wall_ms * 1e9)

    @property
    def fraction_of_peak(self) -> float | None:
        achieved, peak = self.achieved_tflops, self.peak_tflops
        return achieved / peak if achieved is not None and peak else None

    def line(self) -> str:
        """One line: FLOPs, time, rate and fraction of the peak, or what is missing."""
        if self.flops is None:
            return ("Roofline: FLOPs unknown (profile the ONNX model, or pass --flops-model MODEL.onnx "
                    "for a plan)")
        text = f"Roofline: {self.flops.total / 1e9:.3f} GFLOP per query"
        if self.wall_ms:
            text += f" in {self.wall_ms:.4f} ms ({self.timing})" if self.timing else f" in {self.wall_ms:.4f} ms"
            text += f" = {self.achieved_tflops:.2f} TFLOP/s"
        if self.peaks is None:
            return text + "; unknown device: no roofline column"
        peak = self.peak_tflops
        text += f" = {100 * (self.fraction_of_peak or 0.0):.1f}% of {self.peaks.name} " \
                f"{peak_precision(self.precision)} peak {peak:g} TFLOP/s"
        if self.peaks.measured_matmul_tflops and self.achieved_tflops is not None and self.precision in (
            "fp16", "bf16"
        ):
            measured = self.peaks.measured_matmul_tflops
            text += f" ({100 * self.achieved_tflops / measured:.1f}% of a measured {measured:g} TFLOP/s matmul)"
        return text + f"; kernels busy {self.kernel_ms:.4f} ms per query"

    def to_json(self) -> dict[str, Any]:
        return {
            "flops": self.flops.to_json() if self.flops is not None else None,
            "device_peaks": self.peaks.to_json() if self.peaks is not None else None,
            "precision": self.precision,
            "peak_column": peak_precision(self.precision),
            "peak_tflops": self.peak_tflops,
            "wall_ms": self.wall_ms,
            "timing": self.timing,
            "kernel_ms": self.kernel_ms,
            "achieved_tflops": self.achieved_tflops,
            "fraction_of_peak": self.fraction_of_peak,
        }


def format_kind_rates(table: KernelTable, rates: list[KindRate]) -> str:
    """Time per kernel kind, with GFLOP, TFLOP/s and the fraction of the peak where FLOPs are credited."""
    by_kind = {r.kind: r for r in rates}
    rows: list[tuple[str, ...]] = [("kind", "time %", "ms/iter", "kernels", "GFLOP/iter", "TFLOP/s", "of peak")]
    for k in table.by_kind():
        rate = by_kind.get(k.kind)
        ms = k.total_us / max(table.iterations, 1) / 1e3
        tflops = rate.tflops if rate else None
        frac = rate.fraction_of_peak if rate else None
        rows.append((
            k.kind, f"{k.share:5.1f}%", f"{ms:.4f}", str(k.kernels),
            f"{rate.flops_per_iteration / 1e9:.3f}" if rate else "",
            f"{tflops:.2f}" if tflops is not None else "",
            f"{100 * frac:.1f}%" if frac is not None else "",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["By kind (counted FLOPs credited to matmul/conv and attention kernels; per-kernel FLOPs unknown):"]
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
              .rstrip() for r in rows]
    return "\n".join(lines)
