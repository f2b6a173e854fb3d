"""Indexing operators: Gather*, Scatter*, OneHot.

ONNX allows negative indices (counted from the end of the axis) everywhere here; torch's
``index_select``/``gather``/``scatter`` do not, so indices are normalised first: in Python when
they are known at trace time, with ``torch.where`` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .common import norm_axis, tensor
from .ops_shape import prod
from .registry import Node, OpSpec, RunContext
from .values import ShapeValue, Value, rank_of, shape_of, static_floats, static_ints

__all__ = ["CONVERTERS"]

Inputs = Sequence["Value | None"]
Outputs = list["Value | None"]


def _wrap(index: torch.Tensor, size: Any) -> torch.Tensor:
    return torch.where(index < 0, index + size, index)


def _wrap_int(index: Any, size: Any) -> Any:
    return index + size if isinstance(index, int) and index < 0 else index


def _gather(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    data, indices = inputs[0], inputs[1]
    assert data is not None and indices is not None
    axis = norm_axis(node.attr("axis", 0), rank_of(data))
    if isinstance(indices, ShapeValue) and indices.is_static:
        size = shape_of(data)[axis]
        picked = [_wrap_int(int(i), size) for i in indices.items]
        if isinstance(data, ShapeValue):
            return [data.with_items([data.items[i] for i in picked], scalar=indices.scalar)]
        t = tensor(data, ctx)
        if indices.scalar:
            return [t.select(axis, picked[0])]
        if len(picked) == 1:
            return [t.narrow(axis, picked[0], 1)]
        return [t.index_select(axis, torch.tensor(picked, dtype=torch.int64, device=t.device))]
    t = tensor(data, ctx)
    idx = _wrap(tensor(indices, ctx).long(), t.shape[axis])
    flat = t.index_select(axis, idx.reshape(-1))
    return [flat.reshape(*t.shape[:axis], *idx.shape, *t.shape[axis + 1 :])]


def _gather_elements(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    data, indices = tensor(inputs[0], ctx), tensor(inputs[1], ctx)
    axis = norm_axis(node.attr("axis", 0), data.dim())
    return [torch.gather(data, axis, _wrap(indices.long(), data.shape[axis]))]


def _nd_index(data: torch.Tensor, indices: torch.Tensor, batch_dims: int) -> tuple[torch.Tensor, ...]:
    """Advanced-indexing tuple addressing ``data`` with GatherND/ScatterND ``indices``."""
    k = indices.shape[-1]
    idx = indices.long()
    parts: list[torch.Tensor] = []
    lead = idx.shape[:-1]
    for b in range(batch_dims):
        shape = [1] * len(lead)
        shape[b] = lead[b]
        parts.append(torch.arange(lead[b], device=data.device).reshape(shape))
    for i in range(k):
        parts.append(_wrap(idx[..., i], data.shape[batch_dims + i]))
    return tuple(parts)


def _gather_nd(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    data, indices = tensor(inputs[0], ctx), tensor(inputs[1], ctx)
    return [data[_nd_index(data, indices, int(node.attr("batch_dims", 0)))]]


# ONNX reduction name -> torch scatter_reduce / index_reduce name
_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _scatter_elements(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    data, indices, updates = tensor(inputs[0], ctx), tensor(inputs[1], ctx), tensor(inputs[2], ctx)
    axis = norm_axis(node.attr("axis", 0), data.dim())
    idx = _wrap(indices.long(), data.shape[axis])
    reduction = node.attr("reduction", "none")
    if reduction == "none":
        return [torch.scatter(data, axis, idx, updates)]
    return [torch.scatter_reduce(data, axis, idx, updates, _REDUCE[reduction], include_self=True)]


def _scatter_nd(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    data, indices, updates = tensor(inputs[0], ctx), tensor(inputs[1], ctx), tensor(inputs[2], ctx)
    k = indices.shape[-1]
    dims = data.shape[:k]
    # Linearise the first k coordinates so every reduction maps onto index_* along dim 0.
    strides = [prod(dims[i + 1 :]) for i in range(k)]
    linear = sum(
        (_wrap(indices[..., i].long(), dims[i]) * strides[i] for i in range(k)),
        torch.zeros((), dtype=torch.int64, device=data.device),
    ).reshape(-1)
    flat = data.reshape(prod(dims), *data.shape[k:])
    source = updates.reshape(linear.shape[0], *data.shape[k:])
    reduction = node.attr("reduction", "none")
    if reduction == "none":
        out = flat.index_copy(0, linear, source)
    elif reduction == "add":
        out = flat.index_add(0, linear, source)
    else:
        index = linear.reshape(-1, *([1] * (source.dim() - 1))).expand_as(source)
        out = flat.scatter_reduce(0, index, source, _REDUCE[reduction], include_self=True)
    return [out.reshape(data.shape)]


def _one_hot(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    indices, depth_v, values = tensor(inputs[0], ctx), inputs[1], tensor(inputs[2], ctx)
    assert depth_v is not None
    depth = int(static_floats(depth_v)[0]) if depth_v.dtype.is_floating_point else static_ints(depth_v)[0]
    axis = norm_axis(node.attr("axis", -1), indices.dim() + 1)
    idx = indices if not indices.is_floating_point() else indices.long()
    idx = _wrap(idx.long(), depth).unsqueeze(axis)
    shape = [1] * (indices.dim() + 1)
    shape[axis] = depth
    classes = torch.arange(depth, device=indices.device).reshape(shape)
    return [torch.where(idx == classes, values[1], values[0])]


_TABLE: dict[str, tuple[Callable[[Node, Inputs, RunContext], Outputs], int]] = {
    "Gather": (_gather, 13),
    "GatherElements": (_gather_elements, 13),
    "GatherND": (_gather_nd, 13),
    "ScatterElements": (_scatter_elements, 18),
    "ScatterND": (_scatter_nd, 18),
    "OneHot": (_one_hot, 28),
}

CONVERTERS: dict[str, OpSpec] = {op: OpSpec(fn, version) for op, (fn, version) in _TABLE.items()}
