"""Elementwise math, comparison, logic, bitwise and cast operators.

Ops that shape arithmetic uses (``Add``, ``Mul``, ``Div``, ``Equal``, ``Where``, ``Cast``...)
also run on :class:`~.values.ShapeValue` inputs as Python arithmetic, so exported graphs keep
symbolic sizes instead of reading traced tensors.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

import torch

from .common import all_shape_values, broadcast_items, tensor, tensors
from .narrow import cast_to, has_special_cast
from .registry import Node, OpSpec, RunContext
from .values import ShapeValue, Value, is_float_dtype, onnx_to_torch_dtype, py_cast, torch_to_onnx_type, widen_unsigned

__all__ = ["CONVERTERS"]

Inputs = Sequence["Value | None"]
Outputs = list["Value | None"]


def _trunc_div(a: Any, b: Any) -> Any:
    """Integer division rounding toward zero, as ONNX ``Div`` does on integers."""
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return a // b  # symbolic sizes are non-negative, so floor == trunc


def _py_floor(x: Any) -> Any:
    if isinstance(x, float):
        return float(math.floor(x))
    return torch.sym_float(math.floor(x)) if isinstance(x, torch.SymFloat) else x


def _py_ceil(x: Any) -> Any:
    if isinstance(x, float):
        return float(math.ceil(x))
    return torch.sym_float(math.ceil(x)) if isinstance(x, torch.SymFloat) else x


def _py_sign(x: Any) -> Any:
    return type(x)((x > 0) - (x < 0)) if isinstance(x, int | float) else (x > 0) - (x < 0)


# op type -> (torch function, Python function for shape values or None)
_UNARY: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[Any], Any] | None]] = {
    "Abs": (torch.abs, abs),
    "Neg": (torch.neg, operator.neg),
    "Ceil": (torch.ceil, _py_ceil),
    "Floor": (torch.floor, _py_floor),
    "Sign": (torch.sign, _py_sign),
    "Not": (torch.logical_not, operator.not_),
    "Sqrt": (torch.sqrt, None),
    "Exp": (torch.exp, None),
    "Log": (torch.log, None),
    "Reciprocal": (torch.reciprocal, None),
    "Sin": (torch.sin, None),
    "Cos": (torch.cos, None),
    "Tan": (torch.tan, None),
    "Asin": (torch.asin, None),
    "Acos": (torch.acos, None),
    "Atan": (torch.atan, None),
    "Sinh": (torch.sinh, None),
    "Cosh": (torch.cosh, None),
    "Asinh": (torch.asinh, None),
    "Acosh": (torch.acosh, None),
    "Atanh": (torch.atanh, None),
    "Erf": (torch.erf, None),
    "Round": (torch.round, None),
    "IsNaN": (torch.isnan, None),
    "BitwiseNot": (torch.bitwise_not, None),
}


def _unary(op_type: str) -> Callable[[Node, Inputs, RunContext], Outputs]:
    torch_fn, py_fn = _UNARY[op_type]

    def convert(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
        x = inputs[0]
        if py_fn is not None and isinstance(x, ShapeValue):
            out_dtype = torch.bool if op_type == "Not" else None
            return [broadcast_items(py_fn, [x], out_dtype)]
        return [widen_unsigned(torch_fn, tensor(x, ctx))]

    return convert


def _float_aware_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if is_float_dtype(a.dtype):
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")


def _pow(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # ONNX Pow keeps the base's type even for a float exponent on an integer base.
    if is_float_dtype(a.dtype) and b.dtype != a.dtype:
        b = b.to(a.dtype) if is_float_dtype(b.dtype) else b
    result = torch.pow(a, b)
    return result if result.dtype == a.dtype else result.to(a.dtype)


def _xor(a: Any, b: Any) -> Any:
    return bool(a) != bool(b)


def _bitshift(node: Node) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if node.attr("direction") == "LEFT":
        return torch.bitwise_left_shift
    return torch.bitwise_right_shift


def _py_div(node: Node, dtype: torch.dtype) -> Callable[[Any, Any], Any]:
    return operator.truediv if is_float_dtype(dtype) else _trunc_div


def _py_mod(node: Node, dtype: torch.dtype) -> Callable[[Any, Any], Any]:
    if node.attr("fmod", 0):
        return math.fmod
    return operator.mod


def _tensor_mod(node: Node) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return torch.fmod if node.attr("fmod", 0) else torch.remainder


def _static(fn: Callable[..., Any]) -> Callable[[Node, torch.dtype], Callable[..., Any]]:
    return lambda node, dtype: fn


def _fixed(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[Node], Any]:
    return lambda node: fn


# op type -> (torch function factory, Python function factory or None, result is bool)
_BINARY: dict[str, tuple[Callable[[Node], Any], Callable[[Node, torch.dtype], Any] | None, bool]] = {
    "Add": (_fixed(torch.add), _static(operator.add), False),
    "Sub": (_fixed(torch.sub), _static(operator.sub), False),
    "Mul": (_fixed(torch.mul), _static(operator.mul), False),
    "Div": (_fixed(_float_aware_div), _py_div, False),
    "Mod": (_tensor_mod, _py_mod, False),
    "Pow": (_fixed(_pow), None, False),
    "Equal": (_fixed(torch.eq), _static(operator.eq), True),
    "Less": (_fixed(torch.lt), _static(operator.lt), True),
    "LessOrEqual": (_fixed(torch.le), _static(operator.le), True),
    "Greater": (_fixed(torch.gt), _static(operator.gt), True),
    "GreaterOrEqual": (_fixed(torch.ge), _static(operator.ge), True),
    "And": (_fixed(torch.logical_and), _static(lambda a, b: bool(a) and bool(b)), True),
    "Or": (_fixed(torch.logical_or), _static(lambda a, b: bool(a) or bool(b)), True),
    "Xor": (_fixed(torch.logical_xor), _static(_xor), True),
    "BitwiseAnd": (_fixed(torch.bitwise_and), None, False),
    "BitwiseOr": (_fixed(torch.bitwise_or), None, False),
    "BitwiseXor": (_fixed(torch.bitwise_xor), None, False),
    "BitShift": (_bitshift, None, False),
}


def _binary(op_type: str) -> Callable[[Node, Inputs, RunContext], Outputs]:
    torch_factory, py_factory, bool_out = _BINARY[op_type]

    def convert(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
        a, b = inputs[0], inputs[1]
        if py_factory is not None and isinstance(a, ShapeValue) and isinstance(b, ShapeValue):
            fn = py_factory(node, a.dtype)
            return [broadcast_items(fn, [a, b], torch.bool if bool_out else None)]
        x, y = tensors([a, b], ctx)
        return [widen_unsigned(torch_factory(node), x, y)]

    return convert


def _mean(*xs: torch.Tensor) -> torch.Tensor:
    return reduce(torch.add, xs) / len(xs)


# op type -> (pairwise torch function, Python function for shape values)
_VARIADIC: dict[str, tuple[Callable[..., torch.Tensor], Callable[..., Any] | None]] = {
    "Max": (torch.maximum, max),
    "Min": (torch.minimum, min),
    "Sum": (torch.add, operator.add),
}


def _variadic(op_type: str) -> Callable[[Node, Inputs, RunContext], Outputs]:
    torch_fn, py_fn = _VARIADIC[op_type]

    def convert(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
        present = [v for v in inputs if v is not None]
        if py_fn is not None and all_shape_values(present):
            shape_values = [v for v in present if isinstance(v, ShapeValue)]
            return [reduce(lambda a, b: broadcast_items(py_fn, [a, b]), shape_values)]
        return [reduce(lambda a, b: widen_unsigned(torch_fn, a, b), tensors(present, ctx))]

    return convert


def _mean_op(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    return [_mean(*tensors([v for v in inputs if v is not None], ctx))]


def _where(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    cond, a, b = inputs[0], inputs[1], inputs[2]
    if isinstance(cond, ShapeValue) and isinstance(a, ShapeValue) and isinstance(b, ShapeValue):
        return [broadcast_items(lambda c, x, y: x if c else y, [cond, a, b], a.dtype)]
    c, x, y = tensors([cond, a, b], ctx)
    return [torch.where(c, x, y)]


_PY_CASTABLE = frozenset(
    {torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64}
    | {torch.float16, torch.bfloat16, torch.float32, torch.float64}
)


def _cast_to(x: Value, onnx_type: int, node: Node, ctx: RunContext) -> Value:
    to = onnx_to_torch_dtype(onnx_type)
    if isinstance(x, ShapeValue) and to in _PY_CASTABLE and x.dtype in _PY_CASTABLE and not has_special_cast(onnx_type):
        return x.with_items([py_cast(v, to) for v in x.items], to, scalar=x.scalar)
    t = tensor(x, ctx)
    if has_special_cast(onnx_type):
        return cast_to(t, onnx_type, saturate=bool(node.attr("saturate", 1)), round_mode=node.attr("round_mode", "up"))
    if t.dtype == to:
        return t
    if to == torch.bool:
        return t != 0
    return t.to(to)


def _cast(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = inputs[0]
    assert x is not None
    return [_cast_to(x, int(node.attr("to")), node, ctx)]


def _cast_like(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, like = inputs[0], inputs[1]
    assert x is not None and like is not None
    onnx_type = node.input_type(1) or torch_to_onnx_type(like.dtype)
    return [_cast_to(x, onnx_type, node, ctx)]


def _is_inf(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    if pos and neg:
        return [torch.isinf(x)]
    if pos:
        return [torch.isposinf(x)]
    if neg:
        return [torch.isneginf(x)]
    return [torch.zeros_like(x, dtype=torch.bool)]


def _check_cast(node: Node) -> str | None:
    to = node.attr("to")
    if to is not None:
        try:
            onnx_to_torch_dtype(int(to))
        except Exception as exc:
            return str(exc)
    return None


# Newest operator version each converter implements (later versions only added types).
_VERSIONS: dict[str, int] = {
    "Abs": 13, "Neg": 13, "Ceil": 13, "Floor": 13, "Sign": 13, "Not": 1, "Sqrt": 13, "Exp": 13,
    "Log": 13, "Reciprocal": 13, "Sin": 22, "Cos": 22, "Tan": 22, "Asin": 22, "Acos": 22, "Atan": 22,
    "Sinh": 22, "Cosh": 22, "Asinh": 22, "Acosh": 22, "Atanh": 22, "Erf": 13, "Round": 22,
    "IsNaN": 20, "BitwiseNot": 18,
    "Add": 14, "Sub": 14, "Mul": 14, "Div": 14, "Mod": 28, "Pow": 15, "Equal": 19, "Less": 13,
    "LessOrEqual": 16, "Greater": 13, "GreaterOrEqual": 16, "And": 7, "Or": 7, "Xor": 7,
    "BitwiseAnd": 18, "BitwiseOr": 18, "BitwiseXor": 18, "BitShift": 28,
    "Max": 13, "Min": 13, "Sum": 13,
}  # fmt: skip

CONVERTERS: dict[str, OpSpec] = {
    **{op: OpSpec(_unary(op), _VERSIONS[op]) for op in _UNARY},
    **{op: OpSpec(_binary(op), _VERSIONS[op]) for op in _BINARY},
    **{op: OpSpec(_variadic(op), _VERSIONS[op]) for op in _VARIADIC},
    "Mean": OpSpec(_mean_op, 13),
    "Where": OpSpec(_where, 16),
    "Cast": OpSpec(_cast, 28, _check_cast),
    "CastLike": OpSpec(_cast_like, 25),
    "IsInf": OpSpec(_is_inf, 20),
}
