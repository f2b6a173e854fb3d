"""Activation functions, ``Clip`` and the softmax family."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .common import input_or, norm_axis, tensor
from .registry import Node, OpSpec, RunContext
from .values import ShapeValue, Value

__all__ = ["CONVERTERS"]

Inputs = Sequence["Value | None"]
Outputs = list["Value | None"]
_Act = Callable[[torch.Tensor, Node], torch.Tensor]


def _selu(x: torch.Tensor, node: Node) -> torch.Tensor:
    alpha = node.attr("alpha", 1.67326319217681884765625)
    gamma = node.attr("gamma", 1.05070102214813232421875)
    return gamma * torch.where(x > 0, x, alpha * torch.expm1(x))


def _hard_sigmoid(x: torch.Tensor, node: Node) -> torch.Tensor:
    return torch.clamp(node.attr("alpha", 0.2) * x + node.attr("beta", 0.5), 0.0, 1.0)


def _thresholded_relu(x: torch.Tensor, node: Node) -> torch.Tensor:
    return torch.where(x > node.attr("alpha", 1.0), x, torch.zeros_like(x))


def _shrink(x: torch.Tensor, node: Node) -> torch.Tensor:
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    zero = torch.zeros_like(x)
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, zero)).to(x.dtype)


def _softsign(x: torch.Tensor, node: Node) -> torch.Tensor:
    return x / (1 + torch.abs(x))


def _gelu(x: torch.Tensor, node: Node) -> torch.Tensor:
    return F.gelu(x, approximate=node.attr("approximate", "none"))


def _swish(x: torch.Tensor, node: Node) -> torch.Tensor:
    return x * torch.sigmoid(node.attr("alpha", 1.0) * x)


# op type -> activation of (input, node)
_ACTIVATIONS: dict[str, _Act] = {
    "Relu": lambda x, node: torch.relu(x),
    "Sigmoid": lambda x, node: torch.sigmoid(x),
    "Tanh": lambda x, node: torch.tanh(x),
    "LeakyRelu": lambda x, node: F.leaky_relu(x, node.attr("alpha", 0.01)),
    "Elu": lambda x, node: F.elu(x, node.attr("alpha", 1.0)),
    "Celu": lambda x, node: F.celu(x, node.attr("alpha", 1.0)),
    "Selu": _selu,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": lambda x, node: F.hardswish(x),
    "ThresholdedRelu": _thresholded_relu,
    "Softplus": lambda x, node: F.softplus(x),
    "Softsign": _softsign,
    "Mish": lambda x, node: F.mish(x),
    "Gelu": _gelu,
    "Shrink": _shrink,
    "Swish": _swish,
}


def _activation(op_type: str) -> Callable[[Node, Inputs, RunContext], Outputs]:
    fn = _ACTIVATIONS[op_type]

    def convert(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
        return [fn(tensor(inputs[0], ctx), node)]

    return convert


def _prelu(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x, slope = tensor(inputs[0], ctx), tensor(inputs[1], ctx)
    return [torch.where(x < 0, x * slope, x)]


def _bound(value: Value | None) -> Any:
    """A Clip bound: a Python number when known at trace time, else the tensor."""
    if isinstance(value, ShapeValue):
        return value.items[0]
    return value


def _clip(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
    x = tensor(inputs[0], ctx)
    lo, hi = _bound(input_or(inputs, 1)), _bound(input_or(inputs, 2))
    if lo is None and hi is None:
        return [x]
    if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        lo = torch.as_tensor(lo, dtype=x.dtype, device=x.device) if lo is not None else None
        hi = torch.as_tensor(hi, dtype=x.dtype, device=x.device) if hi is not None else None
    return [torch.clamp(x, lo, hi)]


def _tail(shape: Sequence[Any], axis: int) -> Any:
    size: Any = 1
    for d in shape[axis:]:
        size = size * d
    return size


def _hardmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    index = torch.argmax(x, dim=dim, keepdim=True)
    return torch.zeros_like(x).scatter(dim, index, torch.ones_like(index, dtype=x.dtype))


_SOFTMAX: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "Softmax": lambda x, dim: torch.softmax(x, dim),
    "LogSoftmax": lambda x, dim: torch.log_softmax(x, dim),
    "Hardmax": _hardmax,
}


def _softmax(op_type: str) -> Callable[[Node, Inputs, RunContext], Outputs]:
    fn = _SOFTMAX[op_type]

    def convert(node: Node, inputs: Inputs, ctx: RunContext) -> Outputs:
        x = tensor(inputs[0], ctx)
        if node.opset >= 13:
            return [fn(x, norm_axis(node.attr("axis", -1), x.dim()))]
        axis = norm_axis(node.attr("axis", 1), x.dim())
        shape = x.shape
        flat = x.reshape(_tail(shape[:axis], 0), _tail(shape, axis))
        return [fn(flat, 1).reshape(shape)]

    return convert


_VERSIONS: dict[str, int] = {
    "Relu": 14, "Sigmoid": 13, "Tanh": 13, "LeakyRelu": 16, "Elu": 22, "Celu": 28, "Selu": 22,
    "HardSigmoid": 22, "HardSwish": 22, "ThresholdedRelu": 22, "Softplus": 22, "Softsign": 22,
    "Mish": 22, "Gelu": 20, "Shrink": 9, "Swish": 24,
}  # fmt: skip

CONVERTERS: dict[str, OpSpec] = {
    **{op: OpSpec(_activation(op), _VERSIONS[op]) for op in _ACTIVATIONS},
    "PRelu": OpSpec(_prelu, 16),
    "Clip": OpSpec(_clip, 13),
    **{op: OpSpec(_softmax(op), 13) for op in _SOFTMAX},
}
