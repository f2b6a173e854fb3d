"""The error measure of shape verification: relative to the output's scale, with an absolute floor.

``||plan - ref|| / ||ref||`` (the measure before issue 24) is meaningless when the reference is
about zero: an OCR text detector's sigmoid map is ~4e-5 everywhere on random noise, ONNX
Runtime's sigmoid approximation is good to ~1e-7 in absolute terms, so a plan exact to 1.3e-7
read as 2.2 % "relative" error and the build was refused. Polygraphy's default comparison
accepts an element when ``|a - b| <= atol`` or ``|a - b| / |b| <= rtol`` (atol = rtol = 1e-5);
element-wise ratios still blow up where a normal-sized output crosses zero, so here the
difference is normalised by the output's own scale, ``max |ref|``, and that scale is floored:

    error = max |plan - ref| / max(max |ref|, floor)

and a check passes when ``error <= rel``, i.e. ``max |plan - ref| <= rel * max(max |ref|, floor)``:
relative to the output's largest value, absolute (``rel * floor``) for outputs smaller than the
floor. One table, :data:`TOLERANCE`, holds the numbers per precision:

========= ======= ======= ======== ==========================================================
precision rel     floor   repeat   why
========= ======= ======= ======== ==========================================================
fp32      1e-3    1e-2    1e-5     IEEE fp32 vs ONNX Runtime: 1e-7..1e-5 of the scale; absolute
                                   1e-5 below it (Polygraphy's atol), e.g. a sigmoid tail
tf32      2e-2    1e-2    1e-4     10-bit mantissa products; the TF32 accuracy gate judges more
fp16      0.5     0       1e-2     values are judged by the accuracy gate; only gross errors
bf16      0.5     0       1e-2     count here, and no floor: outputs that flush to zero
int8      0.5     0       1e-2     (|y| ~ 1e-10 in fp16) are lost, not "small"
========= ======= ======= ======== ==========================================================

``repeat`` bounds the same measure between two identical calls of the plan (GPU atomics may
change the last bits; a plan reading memory nobody wrote differs by ~1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TOLERANCE", "Tolerance", "scaled_error", "tolerance_for"]


@dataclass(frozen=True)
class Tolerance:
    """How far a plan may be from the reference (see the module docs for the measure).

    Attributes:
        rel: the largest allowed ``max |plan - ref| / max(max |ref|, floor)``.
        floor: the output scale below which errors count in absolute terms (``rel * floor``).
        repeat: the largest allowed measure between two identical calls of the plan.
    """

    rel: float
    floor: float
    repeat: float

    @property
    def atol(self) -> float:
        """The absolute error allowed on outputs smaller than the floor."""
        return self.rel * self.floor

    def scale(self) -> str:
        """The output scale errors are measured against, as messages write it."""
        return f"max(max|ref|, {self.floor:g})" if self.floor else "max|ref|"

    def describe(self) -> str:
        """``1e-3 x max(max|ref|, 0.01)``: what may differ, as messages write it."""
        return f"{self.rel:g} x {self.scale()}"


_REDUCED = Tolerance(rel=0.5, floor=0.0, repeat=1e-2)
#: The allowed error per precision (one table; the module docs say why each number).
TOLERANCE: dict[str, Tolerance] = {
    "fp32": Tolerance(rel=1e-3, floor=1e-2, repeat=1e-5),
    "tf32": Tolerance(rel=2e-2, floor=1e-2, repeat=1e-4),
    "fp16": _REDUCED,
    "bf16": _REDUCED,
    "int8": _REDUCED,
}


def tolerance_for(precision: str) -> Tolerance:
    """The row of :data:`TOLERANCE` for ``precision`` (fp32's for an unknown name)."""
    return TOLERANCE.get(precision, TOLERANCE["fp32"])


def scaled_error(ref: np.ndarray, got: np.ndarray, floor: float) -> float:
    """``max |got - ref| / max(max |ref|, floor)`` over elements finite in both (0 for empty outputs).

    With ``floor`` 0 and an all-zero reference the error is 0 when ``got`` is zero too, else inf.
    """
    a = np.asarray(ref, dtype=np.float64).ravel()
    b = np.asarray(got, dtype=np.float64).ravel()
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.any():
        return 0.0
    a, b = a[finite], b[finite]
    diff = float(np.max(np.abs(a - b)))
    scale = max(float(np.max(np.abs(a))), floor)
    if scale > 0:
        return diff / scale
    return 0.0 if diff == 0 else float("inf")
