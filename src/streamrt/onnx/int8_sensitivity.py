"""The int8 sensitivity pass: find the quantized layers that break the output and keep them fp32.

Plain int8 can destroy a model whose accuracy hangs on a few layers (attention scores, the
classifier of a CTC recognizer). The pass works on the QDQ model with ONNX Runtime on the CPU,
against the fp32 model on sample feeds, with an :class:`~streamrt.measure.accuracy.AccuracyThreshold`
as the target:

1. Quantize everything; if the target is met, stop (no cost beyond one evaluation).
2. Measure each quantized layer alone: the model with only that layer quantized (ONNX
   Runtime's ``nodes_to_exclude`` for all others, ranges from the calibration cache, so no
   recalibration), scored by its margin to the target, ties broken by cosine. One-layer-at-a-
   time *inclusion* isolates each layer's own damage; excluding one layer from a fully quantized
   model barely moves the output when the damage is spread, which ranks poorly.
3. Keep the ``k`` most damaging layers in fp32, with ``k`` found by doubling then bisection
   (about ``2 log2 N`` more evaluations), the smallest ``k`` that meets the target.

ONNX Runtime's ``qdq_loss_debug`` compares activations tensor by tensor (SQNR), which ranks
local error rather than the effect on the output; it is not used here for that reason.

The cost is ``N + 2 log2 N`` quantize-and-run evaluations for ``N`` quantized layers: seconds for
small models, minutes for a few hundred layers; it runs only when a target is given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from streamrt.measure.accuracy import AccuracyReport, AccuracyThreshold, accuracy_of
from streamrt.onnx.runner import onnx_runner

__all__ = ["SensitivityResult", "restore_accuracy"]

logger = logging.getLogger(__name__)

Quantize = Callable[[Sequence[str]], onnx.ModelProto]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class SensitivityResult:
    """What the pass decided: the final model, the layers kept fp32, accuracy before and after."""

    model: onnx.ModelProto
    target: AccuracyThreshold
    kept: tuple[tuple[str, str, float], ...]  # (node, op type, cosine with only it quantized)
    candidates: int
    before: AccuracyReport
    after: AccuracyReport
    met: bool

    @property
    def summary(self) -> str:
        status = "met" if self.met else "NOT met"
        return (
            f"int8: target {self.target} {status}: kept {len(self.kept)} of {self.candidates} quantized layers "
            f"in fp32 (worst margin {self.target.score(self.before):+.4f} -> {self.target.score(self.after):+.4f})"
        )

    def lines(self) -> list[str]:
        return [
            f"int8: kept {node} ({op}) in fp32: cosine {cos:.5f} with only it quantized" for node, op, cos in self.kept
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": str(self.target),
            "met": self.met,
            "candidates": self.candidates,
            "kept_layers": [{"name": n, "op_type": op, "cosine_alone": c} for n, op, c in self.kept],
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
        }


def restore_accuracy(
    prepared: onnx.ModelProto,
    quantize: Quantize,
    op_types: Sequence[str],
    feeds: Sequence[Mapping[str, np.ndarray]],
    target: str | AccuracyThreshold,
    progress: Progress,
) -> SensitivityResult:
    """Run the pass (see the module docs) on the pre-processed float model ``prepared``.

    Args:
        prepared: the float model the quantizer reads (its node names are the layer names).
        quantize: ``quantize(nodes_to_exclude) -> QDQ model``.
        op_types: the quantized op types; their nodes are the candidate layers.
        feeds: sample inputs.
        target: the accuracy to reach against ``prepared`` run in fp32.
        progress: one line per phase.
    """
    threshold = AccuracyThreshold.parse(target)
    reference = onnx_runner(prepared)
    expected = [reference(feed) for feed in feeds]

    def evaluate(model: onnx.ModelProto) -> AccuracyReport:
        run = onnx_runner(model)
        return accuracy_of(zip(expected, (run(f) for f in feeds), strict=True), inputs="sensitivity samples")

    layers = [(n.name, n.op_type) for n in prepared.graph.node if n.op_type in op_types]
    names = [name for name, _ in layers]
    full = quantize(())
    before = evaluate(full)
    if threshold.score(before) >= 0 or not layers:
        progress(f"int8: target {threshold} met with every layer quantized")
        return SensitivityResult(full, threshold, (), len(layers), before, before, True)
    progress(f"int8: target {threshold} missed ({before.violations(threshold)[0]}); measuring {len(layers)} layers")
    damage = []
    for index, (name, op_type) in enumerate(layers):
        alone = evaluate(quantize([n for n in names if n != name]))
        damage.append((threshold.score(alone), alone.min_cosine, name, op_type))
        if (index + 1) % max(1, len(layers) // 5) == 0:
            progress(f"int8: sensitivity {index + 1}/{len(layers)} layers")
    damage.sort()  # most damaging (lowest margin, then lowest cosine) first
    order = [name for _, _, name, _ in damage]

    tried: dict[int, tuple[onnx.ModelProto, AccuracyReport]] = {}

    def attempt(k: int) -> bool:
        if k not in tried:
            model = quantize(order[:k])
            tried[k] = (model, evaluate(model))
        return threshold.score(tried[k][1]) >= 0

    low, high = 0, 1
    while high < len(order) and not attempt(high):
        low, high = high, min(2 * high, len(order))
    met = attempt(high)
    while met and high - low > 1:
        middle = (low + high) // 2
        if attempt(middle):
            high = middle
        else:
            low = middle
    best = high if met else len(order)
    model, after = tried[best]
    kept = tuple((name, op, cos) for _, cos, name, op in damage[:best])
    if not met:
        logger.warning("int8: target %s not met even with all %d layers in fp32", threshold, len(order))
    return SensitivityResult(model, threshold, kept, len(layers), before, after, met)
