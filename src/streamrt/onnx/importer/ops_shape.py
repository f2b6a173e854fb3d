"""Shape and layout operators.

Each converter keeps :class:`~.values.ShapeValue` inputs as Python values where the op is shape
arithmetic (``Shape``, ``Gather`` on shapes lives in :mod:`.ops_index`, ``Slice``, ``Concat``,
``Squeeze``/``Unsqueeze``, ``Reshape`` of a 1-D shape...), and passes sizes to torch as ints or
SymInts, never as tensor contents.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .common import input_or, norm_axis, tensor
from .registry import Node, OpSpec, RunContext
from .values import ShapeValue, Value, rank_of, shape_of, static_ints

__all__ = ["CONVERTERS", "prod", "slice_axis"]

Inputs = Sequence["Value | None"]
Outputs = list["Value | None"]

#: ONNX uses huge int64 values to mean "to the end" in Slice.
_BIG = 2**62


def prod(values: Sequence[Any]) -> Any:
    """Product of ints/SymInts (1 for an empty sequence)."""
    out: Any = 1
    for v in values:
        out = out * v
    return out


def _shape(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = inputs[0]
    assert x is not None
    dims = shape_of(x)
    start, end = node.attr("start", 0), node.attr("end")
    return [ShapeValue(tuple(dims[start:end]), torch.int64)]


def _size(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = inputs[0]
    assert x is not None
    return [ShapeValue((prod(shape_of(x)),), torch.int64, scalar=True)]


def _target_shape(data: Value, shape: Sequence[Any], allowzero: bool) -> list[Any]:
    dims = shape_of(data)
    out = []
    for i, d in enumerate(shape):
        if not allowzero and isinstance(d, int) and d == 0:
            out.append(dims[i])
        else:
            out.append(d)
    return out


def _reshape(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    data, shape_value = inputs[0], inputs[1]
    assert data is not None and shape_value is not None
    target = _target_shape(data, static_ints(shape_value), bool(node.attr("allowzero", 0)))
    if isinstance(data, ShapeValue) and len(target) <= 1:
        if not target:
            return [data.with_items(data.items, scalar=True)]
        return [data.with_items(data.items)]
    return [tensor(data, ctx).reshape(target)]


def _flatten(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    axis = norm_axis(node.attr("axis", 1), x.dim())
    return [x.reshape(prod(x.shape[:axis]), prod(x.shape[axis:]))]


def _axes(node: Node, inputs: Inputs, index: int = 1) -> list[int] | None:
    """Axes from the input (opset >= 13 style) or the ``axes`` attribute (older)."""
    value = input_or(inputs, index)
    if value is not None:
        return [int(a) for a in static_ints(value)]
    attr = node.attr("axes")
    return None if attr is None else [int(a) for a in attr]


def _squeeze(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = inputs[0]
    assert x is not None
    axes = _axes(node, inputs)
    if isinstance(x, ShapeValue) and not x.scalar and len(x.items) == 1:
        return [x.with_items(x.items, scalar=True)]
    t = tensor(x, ctx)
    if axes is None:
        return [t.squeeze()]
    dims = sorted(norm_axis(a, t.dim()) for a in axes)
    return [t.squeeze(tuple(dims)) if dims else t]


def _unsqueeze(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = inputs[0]
    assert x is not None
    axes = _axes(node, inputs) or []
    out_rank = rank_of(x) + len(axes)
    dims = sorted(norm_axis(a, out_rank) for a in axes)
    if isinstance(x, ShapeValue) and x.scalar and dims == [0]:
        return [x.with_items(x.items)]
    t = tensor(x, ctx)
    for d in dims:
        t = t.unsqueeze(d)
    return [t]


def _transpose(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    perm = node.attr("perm")
    if perm is None:
        perm = list(range(x.dim() - 1, -1, -1))
    return [x.permute([norm_axis(p, x.dim()) for p in perm])]


def _concat(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    present = [v for v in inputs if v is not None]
    if all(isinstance(v, ShapeValue) and not v.scalar for v in present):
        items: list[Any] = []
        for v in present:
            assert isinstance(v, ShapeValue)
            items.extend(v.items)
        first = present[0]
        assert isinstance(first, ShapeValue)
        return [ShapeValue(tuple(items), first.dtype)]
    parts = [tensor(v, ctx) for v in present]
    return [torch.cat(parts, dim=norm_axis(node.attr("axis"), parts[0].dim()))]


def _split_sizes(node: Node, inputs: Inputs, dim: Any) -> list[Any]:
    count = len(node.outputs)
    split = input_or(inputs, 1)
    if split is not None:
        return static_ints(split)
    if node.attr("split") is not None:
        return [int(s) for s in node.attr("split")]
    num = node.attr("num_outputs")
    if num is not None:
        chunk = (dim + num - 1) // num
        return [chunk] * (num - 1) + [dim - chunk * (num - 1)]
    return [dim // count] * count


def _split(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = inputs[0]
    assert x is not None
    axis = norm_axis(node.attr("axis", 0), rank_of(x))
    sizes = _split_sizes(node, inputs, shape_of(x)[axis])
    if isinstance(x, ShapeValue):
        out: Outputs = []
        start = 0
        for size in sizes:
            out.append(x.with_items(x.items[start : start + size]))
            start += size
        return out
    return list(torch.split(tensor(x, ctx), sizes, dim=axis))


def _clamp(value: Any, lo: Any, hi: Any) -> Any:
    if isinstance(value, int) and isinstance(lo, int) and isinstance(hi, int):
        return min(max(value, lo), hi)
    return torch.sym_max(lo, torch.sym_min(value, hi))


def _flipped_bounds(start: int, end: int, dim: Any) -> tuple[Any, Any]:
    """Bounds in the flipped axis for a negative-step slice with static start/end.

    With a static size they are ONNX's clamped bounds exactly; with a symbolic size, starts and
    ends are assumed to lie within ``[-size, size)`` (or be the usual "to the end" sentinels),
    which keeps the bounds simple expressions and the export free of guards.
    """
    if isinstance(dim, int):
        lo = min(max(start + dim if start < 0 else start, 0), dim - 1)
        hi = min(max(end + dim if end < 0 else end, -1), dim - 1)
        return dim - 1 - lo, dim - 1 - hi
    s_flip: Any = 0 if start >= _BIG else (-1 - start if start < 0 else dim - 1 - start)
    e_flip: Any = None if end <= -_BIG else (-1 - end if end < 0 else dim - 1 - end)
    return s_flip, e_flip


def slice_axis(x: torch.Tensor, axis: int, start: Any, end: Any, step: int) -> torch.Tensor:
    """``x`` sliced along ``axis`` with ONNX Slice semantics (clamping, negative steps)."""
    if step > 0:
        # Python slicing on tensors wraps negative bounds and clamps, exactly as ONNX does.
        start = max(start, -_BIG) if isinstance(start, int) else start
        end = min(end, _BIG) if isinstance(end, int) else end
        return x[(slice(None),) * axis + (slice(start, end, step),)]
    dim = x.shape[axis]
    if isinstance(start, int) and isinstance(end, int):
        s_flip, e_flip = _flipped_bounds(start, end, dim)
        return x.flip(axis)[(slice(None),) * axis + (slice(s_flip, e_flip, -step),)]
    if isinstance(start, int) and start < 0:
        start = start + dim
    if isinstance(end, int) and end < 0:
        end = end + dim
    start = _clamp(start, 0, dim - 1)
    end = _clamp(end, -1, dim - 1)
    return x.index_select(axis, torch.arange(start, end, step, device=x.device))


def _slice(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = inputs[0]
    assert x is not None
    starts, ends = static_ints(inputs[1]), static_ints(inputs[2])  # type: ignore[arg-type]
    axes_v, steps_v = input_or(inputs, 3), input_or(inputs, 4)
    axes = static_ints(axes_v) if axes_v is not None else list(range(len(starts)))
    steps = static_ints(steps_v) if steps_v is not None else [1] * len(starts)
    rank = rank_of(x)
    if isinstance(x, ShapeValue) and not x.scalar:
        items = list(x.items)
        for start, end, step in zip(starts, ends, steps, strict=True):
            items = items[slice(start, end, step)]
        return [x.with_items(items)]
    t = tensor(x, ctx)
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        t = slice_axis(t, norm_axis(int(axis), rank), start, end, int(step))
    return [t]


def _expand(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    shape = static_ints(inputs[1])  # type: ignore[arg-type]
    rank = max(x.dim(), len(shape))
    x = x.reshape((1,) * (rank - x.dim()) + tuple(x.shape))
    target = [1] * (rank - len(shape)) + list(shape)
    sizes = [-1 if isinstance(t, int) and t == 1 else t for t in target]
    return [x.expand(sizes)]


def _tile(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    return [x.repeat(static_ints(inputs[1]))]  # type: ignore[arg-type]


def _identity(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    return [inputs[0]]


def _depth_to_space(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    b = int(node.attr("blocksize"))
    n, c, h, w = x.shape
    if node.attr("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return [y.reshape(n, c // (b * b), h * b, w * b)]


_SPACE_TO_DEPTH_PERM = {"DCR": (0, 3, 5, 1, 2, 4), "CRD": (0, 1, 3, 5, 2, 4)}


def _space_to_depth(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    b = int(node.attr("blocksize"))
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.permute(*_SPACE_TO_DEPTH_PERM[node.attr("mode", "DCR")])
    return [y.reshape(n, c * b * b, h // b, w // b)]


_TABLE: dict[str, tuple[Callable[[Node, Inputs, RunContext], Outputs], int]] = {
    "Shape": (_shape, 25),
    "Size": (_size, 25),
    "Reshape": (_reshape, 25),
    "Flatten": (_flatten, 25),
    "Squeeze": (_squeeze, 25),
    "Unsqueeze": (_unsqueeze, 25),
    "Transpose": (_transpose, 25),
    "Concat": (_concat, 13),
    "Split": (_split, 18),
    "Slice": (_slice, 13),
    "Expand": (_expand, 13),
    "Tile": (_tile, 13),
    "Identity": (_identity, 25),
    "DepthToSpace": (_depth_to_space, 28),
    "SpaceToDepth": (_space_to_depth, 28),
}

CONVERTERS: dict[str, OpSpec] = {op: OpSpec(fn, version) for op, (fn, version) in _TABLE.items()}
