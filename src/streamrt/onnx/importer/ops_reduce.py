"""Reductions, ArgMax/ArgMin, TopK and CumSum.

The ``axes`` of a reduction are an attribute before opset 18 (13 for ReduceSum) and an input
after; both forms are read. ``noop_with_empty_axes`` and empty reductions (a reduced axis of size
zero gives the reduction's identity, e.g. ``-inf`` for ReduceMax) follow the ONNX spec.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

import torch

from .common import input_or, norm_axis, tensor
from .registry import Node, OpSpec, RunContext
from .values import ShapeValue, Value, is_float_dtype, static_ints

__all__ = ["CONVERTERS"]

Inputs = Sequence["Value | None"]
Outputs = list["Value | None"]
_Reducer = Callable[[torch.Tensor, tuple[int, ...], bool], torch.Tensor]


def _prod(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, dim=d, keepdim=keep)
    return x


def _amax(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    if x.dtype == torch.bool:
        return torch.amax(x.to(torch.uint8), dim=dims, keepdim=keep).to(torch.bool)
    return torch.amax(x, dim=dims, keepdim=keep)


def _amin(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    if x.dtype == torch.bool:
        return torch.amin(x.to(torch.uint8), dim=dims, keepdim=keep).to(torch.bool)
    return torch.amin(x, dim=dims, keepdim=keep)


# op type -> (reducer, identity for an empty reduction, Python reducer for shape values)
_REDUCERS: dict[str, tuple[_Reducer, float, Callable[[Any, Any], Any] | None]] = {
    "ReduceSum": (lambda x, d, k: torch.sum(x, dim=d, keepdim=k, dtype=x.dtype), 0.0, operator.add),
    "ReduceMean": (lambda x, d, k: torch.mean(x, dim=d, keepdim=k), math.nan, None),
    "ReduceMax": (_amax, -math.inf, max),
    "ReduceMin": (_amin, math.inf, min),
    "ReduceProd": (_prod, 1.0, operator.mul),
    "ReduceL1": (lambda x, d, k: torch.sum(torch.abs(x), dim=d, keepdim=k, dtype=x.dtype), 0.0, None),
    "ReduceL2": (lambda x, d, k: torch.sqrt(torch.sum(x * x, dim=d, keepdim=k)), 0.0, None),
    "ReduceSumSquare": (lambda x, d, k: torch.sum(x * x, dim=d, keepdim=k, dtype=x.dtype), 0.0, None),
    "ReduceLogSum": (lambda x, d, k: torch.log(torch.sum(x, dim=d, keepdim=k)), -math.inf, None),
    "ReduceLogSumExp": (lambda x, d, k: torch.logsumexp(x, dim=d, keepdim=k), -math.inf, None),
}

# The opset whose version of the op moved ``axes`` from an attribute to an input.
_AXES_INPUT_SINCE = {op: (13 if op == "ReduceSum" else 18) for op in _REDUCERS}


def _empty_result(x: torch.Tensor, dims: tuple[int, ...], keep: bool, identity: float) -> torch.Tensor:
    shape = (
        [1 if d in dims else s for d, s in enumerate(x.shape)]
        if keep
        else [s for d, s in enumerate(x.shape) if d not in dims]
    )
    if x.dtype == torch.bool:
        return torch.full(shape, identity > 0, dtype=x.dtype, device=x.device)
    if not is_float_dtype(x.dtype) and math.isinf(identity):
        info = torch.iinfo(x.dtype)
        identity = info.min if identity < 0 else info.max
    return torch.full(shape, identity, dtype=x.dtype, device=x.device)


def _reduction(op_type: str) -> Callable[[Node, Inputs, RunContext], Outputs]:
    reducer, identity, py_reducer = _REDUCERS[op_type]

    def convert(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
        data = inputs[0]
        assert data is not None
        keep = bool(node.attr("keepdims", 1))
        if node.opset >= _AXES_INPUT_SINCE[op_type]:
            axes_value = input_or(inputs, 1)
            axes = [int(a) for a in static_ints(axes_value)] if axes_value is not None else []
        else:
            axes = [int(a) for a in node.attr("axes", [])]
        if not axes and node.attr("noop_with_empty_axes", 0):
            return [data]
        if isinstance(data, ShapeValue) and py_reducer is not None and not data.scalar:
            value = reduce(py_reducer, data.items)
            return [data.with_items([value], scalar=not keep)]
        x = tensor(data, ctx)
        dims = tuple(sorted(norm_axis(a, x.dim()) for a in axes)) if axes else tuple(range(x.dim()))
        if any(isinstance(x.shape[d], int) and x.shape[d] == 0 for d in dims):
            return [_empty_result(x, dims, keep, identity)]
        if not dims:
            return [x]
        return [reducer(x, dims, keep)]

    return convert


def _arg(largest: bool) -> Callable[[Node, Inputs, RunContext], Outputs]:
    fn = torch.argmax if largest else torch.argmin

    def convert(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
        x = tensor(inputs[0], ctx)
        axis = norm_axis(node.attr("axis", 0), x.dim())
        keep = bool(node.attr("keepdims", 1))
        if node.attr("select_last_index", 0):
            # torch returns the first extremum; search the flipped axis and map back.
            idx = fn(x.flip(axis), dim=axis, keepdim=keep)
            return [x.shape[axis] - 1 - idx]
        return [fn(x, dim=axis, keepdim=keep)]

    return convert


def _topk(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    k = static_ints(inputs[1])[0]  # type: ignore[arg-type]
    axis = norm_axis(node.attr("axis", -1), x.dim())
    largest = bool(node.attr("largest", 1))
    # A stable sort keeps equal values in index order, as ONNX requires; torch.topk does not.
    values, indices = torch.sort(x, dim=axis, descending=largest, stable=True)
    return [values.narrow(axis, 0, k), indices.narrow(axis, 0, k)]


def _cumsum(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    axis = norm_axis(static_ints(inputs[1])[0], x.dim())  # type: ignore[arg-type]
    if node.attr("reverse", 0):
        x = x.flip(axis)
    y = torch.cumsum(x, dim=axis, dtype=x.dtype)
    if node.attr("exclusive", 0):
        y = y - x
    if node.attr("reverse", 0):
        y = y.flip(axis)
    return [y]


_VERSIONS: dict[str, int] = {
    "ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 20, "ReduceMin": 20, "ReduceProd": 18,
    "ReduceL1": 18, "ReduceL2": 18, "ReduceSumSquare": 18, "ReduceLogSum": 28, "ReduceLogSumExp": 28,
}  # fmt: skip

CONVERTERS: dict[str, OpSpec] = {
    **{op: OpSpec(_reduction(op), _VERSIONS[op]) for op in _REDUCERS},
    "ArgMax": OpSpec(_arg(True), 13),
    "ArgMin": OpSpec(_arg(False), 13),
    "TopK": OpSpec(_topk, 24),
    "CumSum": OpSpec(_cumsum, 14),
}
