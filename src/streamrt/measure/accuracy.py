"""How close a low-precision engine is to its fp32 reference: metrics, thresholds, reports.

This module is the arithmetic only (NumPy): :func:`streamrt.building.accuracy_gate.measure_accuracy` runs
engines and ONNX models and hands their outputs here; every fp16, bf16 and int8 build is measured
that way against ONNX Runtime fp32 on the original model, and so is int8's sensitivity pass.
Per output, over all sample feeds together (in float64):

- ``cosine``: cosine similarity of the flattened outputs (1.0 when both are all-zero).
- ``max_abs`` / ``mean_abs``: largest and mean ``|ref - test|``.
- ``rel_l2``: ``||ref - test|| / ||ref||``, the relative L2 error of the whole tensor.
- ``rel_median`` / ``rel_p99``: median and 99th percentile of the element-wise relative error
  ``|ref - test| / |ref|``, computed as Polygraphy does (a reference that is exactly 0 gets
  machine epsilon added) but reported as quantiles, as Polygraphy's ``--check-error-stat
  median|quantile`` does: the maximum of that ratio is dominated by near-zero references (1e16
  on a softmax) and says nothing; the median and the 99th percentile stay readable.
- ``top1``: for float outputs of rank 2 or 3 whose last axis has >= 2 classes (N x C classifiers,
  B x T x C per-step classifiers), the fraction of positions whose arg-max over the last axis
  agrees with the reference; ``None`` otherwise (an N x C x H x W map's last axis is a width).

A threshold is a small grammar: ``cosine=0.999``, ``top1=0.99,rel_l2=0.05``, or a bare number
(a minimum cosine). ``cosine`` and ``top1`` are minimums; the error metrics are maximums.

Example:
    >>> report = accuracy_of([(reference_outputs, plan_outputs)])       # doctest: +SKIP
    >>> report.violations(AccuracyThreshold.parse("cosine=0.999"))      # doctest: +SKIP
    []
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from streamrt.errors import ConfigError

__all__ = ["AccuracyReport", "AccuracyThreshold", "OutputAccuracy", "accuracy_of"]

_EPSILON = float(np.finfo(np.float64).eps)  # Polygraphy's epsilon for zero references
_QUANTILE_SAMPLE = 1 << 22  # element-wise quantiles over at most ~4M elements per output
#: Metrics where larger is better (thresholds are minimums); the others are maximums.
HIGHER_IS_BETTER = frozenset({"cosine", "top1"})
METRICS = ("cosine", "top1", "max_abs", "mean_abs", "rel_l2", "rel_median", "rel_p99")


@dataclass(frozen=True)
class OutputAccuracy:
    """The metrics of one output (see the module docs); ``problem`` is set when they cannot hold."""

    name: str
    cosine: float
    max_abs: float
    mean_abs: float
    rel_l2: float
    rel_median: float
    rel_p99: float
    top1: float | None
    elements: int
    problem: str | None = None

    def metric(self, name: str) -> float | None:
        value: float | None = getattr(self, name)
        return value

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = str(value)  # JSON has no inf/nan; keep them readable
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutputAccuracy:
        def number(key: str) -> float:
            return float(data[key])

        top1 = data.get("top1")
        return cls(
            name=str(data["name"]),
            cosine=number("cosine"),
            max_abs=number("max_abs"),
            mean_abs=number("mean_abs"),
            rel_l2=number("rel_l2"),
            rel_median=number("rel_median"),
            rel_p99=number("rel_p99"),
            top1=None if top1 is None else float(top1),
            elements=int(data.get("elements", 0)),
            problem=data.get("problem"),
        )

    def line(self) -> str:
        top1 = "" if self.top1 is None else f"  top1 {self.top1:.4f}"
        text = (
            f"{self.name}: cosine {self.cosine:.6f}  max_abs {self.max_abs:.3g}  rel_l2 {self.rel_l2:.3g}  "
            f"rel_median {self.rel_median:.3g}  rel_p99 {self.rel_p99:.3g}{top1}"
        )
        return f"{text}  ({self.problem})" if self.problem else text


@dataclass(frozen=True)
class AccuracyThreshold:
    """Bounds on metrics: minimums for ``cosine``/``top1``, maximums for the error metrics.

    Example:
        >>> AccuracyThreshold.parse("cosine=0.999,top1=0.99").bounds
        {'cosine': 0.999, 'top1': 0.99}
    """

    bounds: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str | float | Mapping[str, float] | AccuracyThreshold) -> AccuracyThreshold:
        """``"cosine=0.999"``, ``"top1=0.99,rel_l2=0.05"``, ``0.999`` (minimum cosine), or a mapping."""
        if isinstance(text, AccuracyThreshold):
            return text
        if isinstance(text, Mapping):
            items: list[tuple[str, Any]] = [(str(k), v) for k, v in text.items()]
        elif isinstance(text, int | float):
            items = [("cosine", text)]
        else:
            items = []
            for part in str(text).split(","):
                key, sep, value = part.strip().partition("=")
                items.append((key.strip(), value) if sep else ("cosine", key))
        bounds: dict[str, float] = {}
        for key, value in items:
            if key not in METRICS:
                raise ConfigError(
                    f"unknown accuracy metric {key!r} in {text!r}; known: {', '.join(METRICS)}",
                    hint="write e.g. cosine=0.999 or top1=0.99,rel_l2=0.05",
                )
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"accuracy bound {key}={value!r} is not a number") from None
            if not math.isfinite(number) or number < 0 or (key in HIGHER_IS_BETTER and number > 1):
                raise ConfigError(f"accuracy bound {key}={value} must be a number in [0, 1] for {key}, >= 0 else")
            bounds[key] = number
        if not bounds:
            raise ConfigError(f"empty accuracy threshold {text!r}", hint="write e.g. cosine=0.999")
        return cls(bounds)

    def __str__(self) -> str:
        return ",".join(f"{key}={value:g}" for key, value in self.bounds.items())

    def violations(self, report: AccuracyReport) -> list[str]:
        """One phrase per (output, metric) outside the bounds, worst first; empty when all pass."""
        found: list[tuple[float, str]] = []
        for out in report.outputs:
            if out.problem:
                found.append((math.inf, f"{out.name}: {out.problem}"))
                continue
            for key, bound in self.bounds.items():
                value = out.metric(key)
                if value is None:
                    continue
                higher = key in HIGHER_IS_BETTER
                if (value < bound) if higher else not (value <= bound):  # NaN fails both ways
                    badness = (bound - value) if higher else (value / bound if bound else math.inf)
                    sign = "<" if higher else ">"
                    found.append(
                        (
                            badness if math.isfinite(badness) else math.inf,
                            f"{out.name}: {key} {value:.6g} {sign} {bound:g}",
                        )
                    )
        return [text for _, text in sorted(found, key=lambda item: -item[0])]

    def score(self, report: AccuracyReport) -> float:
        """One number to rank variants by: the worst margin over bounded metrics (>= 0 passes)."""
        margins = []
        for out in report.outputs:
            if out.problem:
                return -math.inf
            for key, bound in self.bounds.items():
                value = out.metric(key)
                if value is None:
                    continue
                margin = value - bound if key in HIGHER_IS_BETTER else bound - value
                margins.append(margin if math.isfinite(margin) else -math.inf)
        return min(margins, default=0.0)


@dataclass(frozen=True)
class AccuracyReport:
    """Per-output accuracy of an engine against a reference, over ``samples`` feeds."""

    outputs: tuple[OutputAccuracy, ...]
    samples: int
    inputs: str = ""  # where the feeds came from ("calibration data", "random inputs"...)
    reference: str = "onnxruntime fp32"

    def output(self, name: str) -> OutputAccuracy:
        return next(o for o in self.outputs if o.name == name)

    @property
    def min_cosine(self) -> float:
        return min((o.cosine for o in self.outputs), default=1.0)

    def violations(self, threshold: AccuracyThreshold) -> list[str]:
        return threshold.violations(self)

    def lines(self) -> list[str]:
        head = f"accuracy vs {self.reference} on {self.samples} feed(s)" + (f" of {self.inputs}" if self.inputs else "")
        return [head, *(f"  {o.line()}" for o in self.outputs)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "inputs": self.inputs,
            "samples": self.samples,
            "outputs": [o.to_dict() for o in self.outputs],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AccuracyReport:
        return cls(
            outputs=tuple(OutputAccuracy.from_dict(o) for o in data.get("outputs", [])),
            samples=int(data.get("samples", 0)),
            inputs=str(data.get("inputs", "")),
            reference=str(data.get("reference", "")),
        )


class _Accumulator:
    """Running sums for one output across feeds (shapes may differ between feeds)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dot = self.ref_sq = self.test_sq = self.diff_sq = self.abs_sum = 0.0
        self.max_abs = 0.0
        self.elements = 0
        self.rel: list[np.ndarray] = []
        self.agree = self.rows = 0
        self.has_top1 = True
        self.problem: str | None = None

    def add(self, ref_raw: Any, test_raw: Any) -> None:
        ref, test = _host(ref_raw), _host(test_raw)
        if ref.shape != test.shape:
            self.problem = f"shape {list(test.shape)} differs from the reference's {list(ref.shape)}"
            return
        a = ref.astype(np.float64).ravel()
        b = test.astype(np.float64).ravel()
        both = np.isfinite(a) & np.isfinite(b)
        same_special = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
        broken = int((~both & ~same_special).sum())
        if broken:
            self.problem = f"{broken} value(s) NaN/inf in only one of reference and plan"
        a, b = a[both], b[both]
        diff = np.abs(a - b)
        self.dot += float(np.dot(a, b))
        self.ref_sq += float(np.dot(a, a))
        self.test_sq += float(np.dot(b, b))
        self.diff_sq += float(np.dot(diff, diff))
        self.abs_sum += float(diff.sum())
        self.max_abs = max(self.max_abs, float(diff.max()) if diff.size else 0.0)
        self.elements += int(diff.size)
        denom = np.abs(a)
        denom[denom == 0] = _EPSILON
        rel = diff / denom
        if rel.size > _QUANTILE_SAMPLE:
            rel = rel[:: math.ceil(rel.size / _QUANTILE_SAMPLE)]
        self.rel.append(rel)
        is_float = ref.dtype.kind == "f" or ref.dtype.name == "bfloat16"
        if is_float and ref.ndim in (2, 3) and ref.shape[-1] >= 2:
            self.agree += int((np.argmax(ref, axis=-1) == np.argmax(test, axis=-1)).sum())
            self.rows += int(np.prod(ref.shape[:-1]))
        else:
            self.has_top1 = False

    def result(self) -> OutputAccuracy:
        nan = float("nan")
        if self.ref_sq == 0.0 and self.test_sq == 0.0:
            cosine = 1.0
        elif self.ref_sq == 0.0 or self.test_sq == 0.0:
            cosine = 0.0
        else:
            cosine = self.dot / math.sqrt(self.ref_sq * self.test_sq)
        rel = np.concatenate(self.rel) if self.rel else np.zeros(0)
        return OutputAccuracy(
            name=self.name,
            cosine=min(1.0, cosine),
            max_abs=self.max_abs,
            mean_abs=self.abs_sum / self.elements if self.elements else 0.0,
            rel_l2=math.sqrt(self.diff_sq / self.ref_sq) if self.ref_sq else (0.0 if self.diff_sq == 0 else math.inf),
            rel_median=float(np.median(rel)) if rel.size else nan,
            rel_p99=float(np.quantile(rel, 0.99)) if rel.size else nan,
            top1=self.agree / self.rows if self.has_top1 and self.rows else None,
            elements=self.elements,
            problem=self.problem,
        )


def _host(value: Any) -> np.ndarray:
    """A NumPy array from an output (NumPy, or a torch tensor on any device)."""
    if hasattr(value, "detach"):
        return np.asarray(value.detach().cpu().numpy())
    return np.asarray(value)


def accuracy_of(
    pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]], *, inputs: str = "", reference: str = ""
) -> AccuracyReport:
    """The report for ``(reference outputs, test outputs)`` pairs, one pair per feed (NumPy or torch)."""
    acc: dict[str, _Accumulator] = {}
    samples = 0
    for ref, test in pairs:
        samples += 1
        for name, value in ref.items():
            slot = acc.setdefault(name, _Accumulator(name))
            if name not in test:
                slot.problem = "missing from the plan's outputs"
                continue
            slot.add(value, test[name])
    return AccuracyReport(tuple(a.result() for a in acc.values()), samples, inputs, reference)
