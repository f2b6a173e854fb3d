"""Tensor creation and whole-tensor operators: Constant*, Range, Pad, Trilu, EyeLike, Dropout, Det."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .common import input_or, norm_axis, tensor
from .registry import Node, OpSpec, RunContext
from .values import SHAPE_VALUE_MAX_ELEMENTS, ShapeValue, Value, numpy_to_torch, static_ints

__all__ = ["CONVERTERS"]

Inputs = Sequence["Value | None"]
Outputs = list["Value | None"]

_PY_DTYPES = frozenset({torch.bool, torch.int32, torch.int64, torch.float32, torch.float64})


def _constant(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    # OnnxModule folds Constant nodes into buffers at import; this runs only if called directly.
    attrs = node.attrs
    if "value" in attrs:
        return [numpy_to_torch(np.asarray(attrs["value"])).to(ctx.device)]
    table = {
        "value_float": torch.float32,
        "value_floats": torch.float32,
        "value_int": torch.int64,
        "value_ints": torch.int64,
    }
    for key, dtype in table.items():
        if key in attrs:
            return [torch.tensor(attrs[key], dtype=dtype, device=ctx.device)]
    raise ValueError(f"Constant node '{node.name}' has no supported value attribute")


def _check_constant(node: Node) -> str | None:
    known = {"value", "value_float", "value_floats", "value_int", "value_ints"}
    if not known.intersection(node.attrs):
        return f"only numeric Constant values are supported, got attributes {sorted(node.attrs)}"
    return None


def _constant_of_shape(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    shape = static_ints(inputs[0])  # type: ignore[arg-type]
    value = node.attr("value")
    fill = numpy_to_torch(np.asarray(value).reshape(-1)) if value is not None else torch.zeros(1)
    dtype = fill.dtype
    item: Any = fill[0].item()
    if len(shape) == 1 and isinstance(shape[0], int) and shape[0] <= SHAPE_VALUE_MAX_ELEMENTS and dtype in _PY_DTYPES:
        return [ShapeValue((item,) * shape[0], dtype)]
    return [torch.full(shape, item, dtype=dtype, device=ctx.device)]


def _scalar(value: Value | None) -> Any:
    if isinstance(value, ShapeValue):
        return value.items[0]
    assert value is not None
    return value.reshape(()).item()


def _range(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    start, limit, delta = (_scalar(v) for v in inputs[:3])
    first = inputs[0]
    assert first is not None
    static = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, limit, delta))
    if static and all(isinstance(v, ShapeValue) for v in inputs[:3]) and delta != 0:
        items = range(start, limit, delta)
        if len(items) <= SHAPE_VALUE_MAX_ELEMENTS:
            # e.g. the axes of a reduction computed from a rank: keep them Python values.
            return [ShapeValue(tuple(items), first.dtype)]
    return [torch.arange(start, limit, delta, dtype=first.dtype, device=ctx.device)]


def _pad_index(size: Any, begin: Any, end: Any, mode: str, device: torch.device) -> torch.Tensor:
    """Source index for every output position along one axis, for the non-constant modes."""
    pos = torch.arange(-begin, size + end, device=device)
    if mode == "edge":
        return pos.clamp(0, size - 1)
    if mode == "wrap":
        return torch.remainder(pos, size)
    period = 2 * (size - 1)  # reflect: mirror without repeating the edge
    folded = torch.remainder(pos, period) if period > 0 else torch.zeros_like(pos)
    return torch.where(folded >= size, period - folded, folded)


def _pad(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    rank = x.dim()
    pads = static_ints(inputs[1]) if input_or(inputs, 1) is not None else [int(p) for p in node.attr("pads", [])]  # type: ignore[arg-type]
    axes_value = input_or(inputs, 3)
    axes = [norm_axis(int(a), rank) for a in static_ints(axes_value)] if axes_value is not None else list(range(rank))
    n = len(axes)
    begins = dict(zip(axes, pads[:n], strict=True))
    ends = dict(zip(axes, pads[n:], strict=True))
    mode = node.attr("mode", "constant")
    if mode == "constant":
        fill_value = input_or(inputs, 2)
        fill: Any = 0
        if fill_value is not None:
            fill = _scalar(fill_value)
        torch_pads: list[Any] = []
        for d in reversed(range(rank)):
            torch_pads += [begins.get(d, 0), ends.get(d, 0)]
        if x.dtype == torch.bool:
            return [F.pad(x.to(torch.uint8), torch_pads, value=float(bool(fill))).to(torch.bool)]
        return [F.pad(x, torch_pads, value=fill)]
    for d in axes:
        b, e = begins[d], ends[d]
        if isinstance(b, int) and isinstance(e, int) and b == 0 and e == 0:
            continue
        x = x.index_select(d, _pad_index(x.shape[d], b, e, mode, x.device))
    return [x]


def _trilu(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    k_value = input_or(inputs, 1)
    k = static_ints(k_value)[0] if k_value is not None else 0
    return [torch.triu(x, k) if node.attr("upper", 1) else torch.tril(x, k)]


def _eye_like(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    from .values import onnx_to_torch_dtype

    x = tensor(inputs[0], ctx)
    dtype = onnx_to_torch_dtype(int(node.attr("dtype"))) if node.attr("dtype") is not None else x.dtype
    k = int(node.attr("k", 0))
    rows = torch.arange(x.shape[0], device=x.device).unsqueeze(1)
    cols = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    return [(cols - rows == k).to(dtype)]


def _dropout(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    training_value = input_or(inputs, 2)
    training = bool(_scalar(training_value)) if training_value is not None else False
    ratio_value = input_or(inputs, 1)
    ratio = float(_scalar(ratio_value)) if ratio_value is not None else float(node.attr("ratio", 0.5))
    if not training or ratio == 0.0:
        return [x, torch.ones_like(x, dtype=torch.bool)]
    mask = torch.rand_like(x, dtype=torch.float32) >= ratio
    return [x * mask.to(x.dtype) / (1.0 - ratio), mask]


def _det(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    return [torch.linalg.det(tensor(inputs[0], ctx))]


_TABLE: dict[str, tuple[Callable[[Node, Inputs, RunContext], Outputs], int, Callable[[Node], str | None] | None]] = {
    "Constant": (_constant, 25, _check_constant),
    "ConstantOfShape": (_constant_of_shape, 25, None),
    "Range": (_range, 27, None),
    "Pad": (_pad, 25, None),
    "Trilu": (_trilu, 14, None),
    "EyeLike": (_eye_like, 22, None),
    "Dropout": (_dropout, 22, None),
    "Det": (_det, 22, None),
}

CONVERTERS: dict[str, OpSpec] = {op: OpSpec(fn, version, check) for op, (fn, version, check) in _TABLE.items()}
