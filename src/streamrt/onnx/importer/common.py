"""Helpers shared by the converter modules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .registry import Node, RunContext
from .values import ShapeValue, Value, to_tensor

__all__ = [
    "all_shape_values",
    "broadcast_items",
    "input_or",
    "norm_axis",
    "tensor",
    "tensors",
    "unsupported",
]


def norm_axis(axis: int, rank: int) -> int:
    """ONNX allows negative axes counted from the end; torch wants them in ``[0, rank)``."""
    return axis + rank if axis < 0 else axis


def tensor(value: Value | None, ctx: RunContext) -> torch.Tensor:
    """An input as a tensor (a missing input is a bug in the converter's caller)."""
    if value is None:
        raise ValueError("a required input is missing")
    return to_tensor(value, ctx.device)


def tensors(values: Sequence[Value | None], ctx: RunContext) -> list[torch.Tensor]:
    return [tensor(v, ctx) for v in values]


def input_or(inputs: Sequence[Value | None], index: int) -> Value | None:
    """The ``index``-th input, ``None`` when it is omitted or beyond the given inputs."""
    return inputs[index] if index < len(inputs) else None


def all_shape_values(values: Sequence[Value | None]) -> bool:
    """True when every value is a :class:`ShapeValue` (so the op can run on Python values)."""
    return bool(values) and all(isinstance(v, ShapeValue) for v in values)


def broadcast_items(
    fn: Callable[..., Any], values: Sequence[ShapeValue], dtype: torch.dtype | None = None
) -> ShapeValue:
    """Apply ``fn`` elementwise to 0-D/1-D shape values with NumPy broadcasting."""
    length = max(len(v.items) for v in values)
    if any(len(v.items) not in (1, length) for v in values):
        raise ValueError(f"cannot broadcast shape values of lengths {[len(v.items) for v in values]}")
    scalar = all(v.scalar for v in values)
    items = [fn(*(v.items[0] if len(v.items) == 1 else v.items[i] for v in values)) for i in range(length)]
    return ShapeValue(tuple(items), dtype or values[0].dtype, scalar)


def unsupported(node: Node, why: str) -> NotImplementedError:
    """An error for an attribute combination found only at run time."""
    return NotImplementedError(f"{node.op_type} node '{node.name}': {why}")
