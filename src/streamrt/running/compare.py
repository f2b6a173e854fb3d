"""Compare the outputs of two engines (backends, precisions or plans) on the same inputs.

Every output is compared in float64. An element passes when ``|a - b| <= atol + rtol * |a|``
with ``a`` the reference (engine A): NumPy's ``isclose`` rule, asymmetric on purpose so the
reference decides the scale. NaNs in the same place of both outputs count as equal, and so do
infinities of the same sign.

Reported per output: max and mean absolute error; max relative error ``|a - b| / max(|a|, f)``
whose floor ``f`` is :data:`REL_FLOOR` times the reference's largest magnitude, so elements near
zero (a softmax's 1e-20 tail) cannot blow it up to 1e16 while the elements that matter keep their
plain relative error; relative L2 error ``||a - b|| / ||a||``; cosine similarity of the flattened
outputs; and, for float outputs of any rank whose last axis has C > 1 entries (classifiers N x C,
sequence models B x T x C), the fraction of rows (all leading positions) whose arg-max over the
last axis agrees (top-1) and whose reference arg-max is among the tested top 5 (top-5, C > 5).

Element-wise tolerances suit fp32 and fp16; int8 moves a few elements far while keeping the
output's direction (what a classifier's arg-max depends on). ``min_cosine`` judges an output by
its cosine similarity to the reference instead: it passes when ``cosine >= min_cosine``.

Example:
    >>> diffs = compare_outputs(ref_outputs, test_outputs, atol=1e-3, rtol=1e-3)   # doctest: +SKIP
    >>> all(d.passed for d in diffs)                                               # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from streamrt.running.inputs import to_device, to_numpy
from streamrt.types import Shape, format_shape

if TYPE_CHECKING:
    from streamrt.backends.base import Engine

__all__ = [
    "REL_FLOOR",
    "OutputDiff",
    "compare_outputs",
    "format_diffs",
    "run_numpy",
    "top1_agreement",
    "topk_agreement",
]

log = logging.getLogger(__name__)

REL_FLOOR = 1e-3
"""Relative errors are taken against at least this fraction of the reference's largest magnitude."""


@dataclass(frozen=True)
class OutputDiff:
    """How one output of the tested engine differs from the reference.

    Attributes:
        name: output name.
        shape: reference shape.
        max_abs: largest ``|a - b|``.
        mean_abs: mean ``|a - b|``.
        max_rel: largest ``|a - b| / max(|a|, REL_FLOOR * max|a|)`` (0 when the reference is all zero
            and so is the difference).
        cosine: cosine similarity of the flattened outputs (1.0 when both are all-zero).
        top1: fraction of rows (leading positions) whose arg-max over the last axis agrees, for
            float outputs whose last axis has more than one entry; else None.
        mismatches: elements outside ``atol + rtol * |a|``.
        total: elements compared.
        atol / rtol: the tolerances applied.
        problem: why the output could not be compared element-wise (missing, shape), else None.
        rel_l2: ``||a - b|| / ||a||`` over finite elements (``||a - b||`` when ``a`` is all zero).
        top5: fraction of rows whose reference arg-max is among the tested top 5 (last axis > 5).
        min_cosine: when set, the output passes on ``cosine >= min_cosine`` instead of tolerances.
    """

    name: str
    shape: Shape
    max_abs: float
    mean_abs: float
    max_rel: float
    cosine: float
    top1: float | None
    mismatches: int
    total: int
    atol: float
    rtol: float
    problem: str | None = None
    rel_l2: float = float("nan")
    top5: float | None = None
    min_cosine: float | None = None

    @property
    def passed(self) -> bool:
        if self.problem is not None:
            return False
        if self.min_cosine is not None:
            return self.cosine >= self.min_cosine
        return self.mismatches == 0

    def to_json(self) -> dict[str, Any]:
        """JSON-ready mapping; metrics that could not be computed (NaN) become ``None``."""
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = None
        data["shape"] = list(self.shape)
        data["passed"] = self.passed
        return data


def topk_agreement(ref: np.ndarray, test: np.ndarray, k: int = 1) -> float | None:
    """Fraction of rows whose reference arg-max over the last axis is among the tested top ``k``.

    Rows are all leading positions (N for N x C, B*T for B x T x C). ``None`` unless both are
    float outputs of equal shape whose last axis has more than ``max(k, 1)`` entries (more than
    one for top-1).
    """
    is_float = ref.dtype.kind == "f" or ref.dtype.name == "bfloat16"
    classes = ref.shape[-1] if ref.ndim else 0
    if not is_float or ref.shape != test.shape or classes < 2 or (k > 1 and classes <= k):
        return None
    want = np.argmax(ref.astype(np.float64), axis=-1)[..., None]
    if k == 1:
        hit = np.argmax(test.astype(np.float64), axis=-1)[..., None] == want
    else:
        top = np.argpartition(-test.astype(np.float64), k - 1, axis=-1)[..., :k]
        hit = np.any(top == want, axis=-1)
    return float(np.mean(hit))


def top1_agreement(ref: np.ndarray, test: np.ndarray) -> float | None:
    """Fraction of rows whose arg-max over the last axis agrees (see :func:`topk_agreement`)."""
    return topk_agreement(ref, test, 1)


def _failed(name: str, shape: Shape, atol: float, rtol: float, problem: str) -> OutputDiff:
    nan = float("nan")
    return OutputDiff(name, shape, nan, nan, nan, nan, None, 0, 0, atol, rtol, problem)


def _diff_one(name: str, ref_raw: Any, test_raw: Any, atol: float, rtol: float) -> OutputDiff:
    ref_np, test_np = to_numpy(ref_raw), to_numpy(test_raw)
    shape = tuple(int(d) for d in ref_np.shape)
    if ref_np.shape != test_np.shape:
        problem = f"shape {format_shape(test_np.shape)} differs from the reference's {format_shape(shape)}"
        return _failed(name, shape, atol, rtol, problem)
    a = ref_np.astype(np.float64).ravel()
    b = test_np.astype(np.float64).ravel()
    same_special = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
    finite = np.isfinite(a) & np.isfinite(b)
    absdiff = np.abs(a[finite] - b[finite])
    bad = ~same_special & ~finite  # a NaN/inf on one side only
    close = absdiff <= atol + rtol * np.abs(a[finite])
    mismatches = int(bad.sum()) + int((~close).sum())
    magnitude = np.abs(a[finite])
    floor = REL_FLOOR * float(magnitude.max()) if magnitude.size else 0.0
    scale = np.maximum(magnitude, floor)
    rel = np.divide(absdiff, scale, out=np.where(absdiff > 0, np.inf, 0.0), where=scale > 0)
    na, nb = float(np.linalg.norm(a[finite])), float(np.linalg.norm(b[finite]))
    diff_norm = float(np.linalg.norm(a[finite] - b[finite]))
    if na == 0.0 and nb == 0.0:
        cosine = 1.0
    elif na == 0.0 or nb == 0.0:
        cosine = 0.0
    else:
        cosine = float(np.dot(a[finite], b[finite]) / (na * nb))
    return OutputDiff(
        name=name,
        shape=shape,
        max_abs=float(absdiff.max()) if absdiff.size else 0.0,
        mean_abs=float(absdiff.mean()) if absdiff.size else 0.0,
        max_rel=float(rel.max()) if rel.size else 0.0,
        cosine=cosine,
        top1=top1_agreement(ref_np, test_np),
        mismatches=mismatches,
        total=int(a.size),
        atol=atol,
        rtol=rtol,
        rel_l2=diff_norm / na if na > 0 else diff_norm,
        top5=topk_agreement(ref_np, test_np, 5),
    )


def compare_outputs(
    ref: Mapping[str, Any],
    test: Mapping[str, Any],
    atol: float = 1e-5,
    rtol: float = 1e-3,
    *,
    min_cosine: float | None = None,
) -> list[OutputDiff]:
    """Compare every output of ``test`` against ``ref`` (NumPy arrays or torch tensors), in float64.

    Outputs are reported in the reference's order; an output missing on either side, or of
    another shape, is reported with ``problem`` set and fails.

    Args:
        ref: reference outputs by name (engine A).
        test: outputs under test by name (engine B).
        atol: absolute tolerance.
        rtol: relative tolerance, scaled by the reference's magnitude.
        min_cosine: judge each output by ``cosine >= min_cosine`` instead of the tolerances.
    """
    from streamrt.errors import ConfigError

    if atol < 0 or rtol < 0:
        raise ConfigError(f"atol and rtol must be >= 0, got atol={atol}, rtol={rtol}")
    if min_cosine is not None and not -1.0 <= min_cosine <= 1.0:
        raise ConfigError(f"min_cosine must be in [-1, 1], got {min_cosine}", hint="e.g. --min-cosine 0.99")
    diffs = []
    for name, value in ref.items():
        shape = tuple(int(d) for d in value.shape)
        if name not in test:
            diffs.append(_failed(name, shape, atol, rtol, "missing from the tested outputs"))
            continue
        diffs.append(dataclasses.replace(_diff_one(name, value, test[name], atol, rtol), min_cosine=min_cosine))
    for name, value in test.items():
        if name not in ref:
            shape = tuple(int(d) for d in value.shape)
            diffs.append(_failed(name, shape, atol, rtol, "missing from the reference outputs"))
    return diffs


def format_diffs(diffs: list[OutputDiff]) -> str:
    """A table, one row per output, ending in a PASSED/FAILED line."""
    header = (
        "output",
        "shape",
        "max abs",
        "mean abs",
        "max rel",
        "rel L2",
        "cosine",
        "top-1",
        "top-5",
        "mismatches",
        "result",
    )
    rows = [header]
    for d in diffs:
        if d.problem is not None:
            dashes = ("-",) * 8
            rows.append((d.name, format_shape(d.shape), *dashes, f"FAILED ({d.problem})"))
            continue
        rows.append(
            (
                d.name,
                format_shape(d.shape),
                f"{d.max_abs:.3e}",
                f"{d.mean_abs:.3e}",
                f"{d.max_rel:.3e}",
                f"{d.rel_l2:.3e}",
                f"{d.cosine:.6f}",
                "-" if d.top1 is None else f"{d.top1 * 100:.2f}%",
                "-" if d.top5 is None else f"{d.top5 * 100:.2f}%",
                "-" if d.min_cosine is not None else f"{d.mismatches}/{d.total}",
                "passed" if d.passed else "FAILED",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    failed = sum(not d.passed for d in diffs)
    atol, rtol = (diffs[0].atol, diffs[0].rtol) if diffs else (0.0, 0.0)
    verdict = "PASSED" if not failed else f"FAILED ({failed} of {len(diffs)} outputs)"
    min_cosine = diffs[0].min_cosine if diffs else None
    if min_cosine is not None:
        lines.append(f"{verdict}: cosine >= {min_cosine:g}")
    else:
        lines.append(f"{verdict}: |a - b| <= atol + rtol * |a| with atol={atol:g}, rtol={rtol:g}")
    return "\n".join(lines)


def run_numpy(engine: Engine, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``engine`` once on host arrays and return host arrays (moving data to a CUDA engine and back)."""
    feeds = to_device(inputs, engine.device_kind)
    with engine.create_context() as ctx:
        outputs = ctx.infer(feeds)
        if engine.device_kind == "cuda":
            import torch

            torch.cuda.synchronize()  # the outputs are valid once the engine's stream gets there
        result = {name: to_numpy(value) for name, value in outputs.items()}
    log.debug("ran %s on %s", engine.manifest.source_name, ", ".join(inputs))
    return result
