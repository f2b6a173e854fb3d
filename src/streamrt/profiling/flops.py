"""FLOPs of one forward pass, counted by ``torch.utils.flop_counter.FlopCounterMode``, per op type.

The counter runs the module once at the given inputs and adds torch's own formulas for the ops
that do multiply-adds (convolutions, matrix products, attention): 2 FLOPs per multiply-add, bias
and element-wise ops not counted. That is the arithmetic a tensor-core kernel has to do, which is
what a roofline compares against; element-wise kernels are memory-bound and get no FLOPs here.

Example:
    >>> import torch
    >>> net = torch.nn.Conv2d(3, 8, 3, padding=1)
    >>> count = count_flops(net, [torch.randn(1, 3, 16, 16)])
    >>> count.total == 2 * 8 * 3 * 9 * 16 * 16, count.by_op
    (True, {'convolution': 110592})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FlopCount", "count_flops", "count_onnx_flops"]


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one forward pass.

    Attributes:
        total: all counted FLOPs.
        by_op: FLOPs per aten op name (``convolution``, ``mm``, ``addmm``, ``bmm``, ...).
        batch: the leading size of the first input (for FLOPs per item).
    """

    total: int
    by_op: Mapping[str, int] = field(default_factory=dict)
    batch: int = 1

    @property
    def per_item(self) -> float:
        return self.total / max(self.batch, 1)

    @property
    def attention(self) -> int:
        """FLOPs in fused attention ops (scaled dot-product attention)."""
        return sum(v for k, v in self.by_op.items() if "attention" in k)

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "per_item": self.per_item, "batch": self.batch, "by_op": dict(self.by_op)}


def count_flops(module: Any, inputs: Sequence[Any]) -> FlopCount:
    """Run ``module(*inputs)`` once under ``FlopCounterMode`` (no grad) and return its counts."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        module(*inputs)
    counts = counter.get_flop_counts().get("Global", {})
    by_op = {str(op).removeprefix("aten.").split(".")[0]: int(n) for op, n in counts.items() if n}
    first = inputs[0] if inputs else None
    batch = int(first.shape[0]) if first is not None and first.ndim > 0 else 1
    return FlopCount(int(counter.get_total_flops()), by_op, batch)


def count_onnx_flops(model: Any, feeds: Mapping[str, Any], device: str = "cpu") -> FlopCount:
    """FLOPs of an ONNX model (a ``ModelProto`` or a path) at ``feeds`` (numpy arrays by input name).

    The model goes through StreamRT's ONNX -> torch importer (the module a torch_inductor plan
    is compiled from) and runs once on ``device``.
    """
    import numpy as np
    import onnx
    import torch

    from streamrt.onnx.importer import import_onnx

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    module = import_onnx(model).eval().to(device)
    tensors = []
    for value in model.graph.input:
        if value.name not in feeds:
            continue
        array = np.ascontiguousarray(feeds[value.name])
        declared = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        if array.dtype != declared and array.dtype.kind == "f" and np.dtype(declared).kind == "f":
            array = array.astype(declared)  # a plan with fp16 inputs, counted on its fp32 source
        tensors.append(torch.as_tensor(array).to(device))
    return count_flops(module, tensors)
