"""The converter table: ONNX op type -> converter function, and what it supports.

Each ``ops_*`` module ends with a ``CONVERTERS`` table of :class:`OpSpec` entries. This module
merges them (an op type may appear in one table only) and answers the support questions the
importer asks before it traces anything: is this op type known, and does the converter
implement the version of the op that the model's opset selects?
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import onnx
import torch

from streamrt.errors import UnsupportedOperatorError

from .values import Value

__all__ = [
    "BACKEND",
    "MIN_OPSET",
    "ConverterFn",
    "Node",
    "OpSpec",
    "RunContext",
    "check_node",
    "converter_table",
    "latest_opset",
    "opset_range",
]

#: Backend name used in UnsupportedOperatorError messages.
BACKEND = "torch_inductor"
#: Oldest default-domain opset the importer accepts.
MIN_OPSET = 11


@dataclass(frozen=True)
class Node:
    """One ONNX node as converters see it.

    Attributes:
        name: Node name (``"<op_type>#<index>"`` when the model leaves it empty).
        op_type: ONNX operator type.
        opset: The model's opset for the node's domain.
        attrs: Attributes as Python values (strings decoded, tensors as NumPy arrays).
        inputs: Input value names (``""`` marks an omitted optional input).
        outputs: Output value names.
        input_types: ONNX element type of each input where the model declares it (initializers,
            graph inputs, value_info, shape inference), else 0. Converters need it where the
            torch dtype is ambiguous (sub-byte types travel in int8/uint8 containers).
    """

    name: str
    op_type: str
    opset: int
    attrs: Mapping[str, Any] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    input_types: tuple[int, ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def input_type(self, index: int) -> int:
        """ONNX element type of input ``index`` (0 when unknown or absent)."""
        return self.input_types[index] if index < len(self.input_types) else 0


@dataclass(frozen=True)
class RunContext:
    """What a converter may need beyond its inputs: where to put new tensors."""

    device: torch.device


ConverterFn: TypeAlias = Callable[[Node, Sequence["Value | None"], RunContext], Sequence["Value | None"]]
CheckFn: TypeAlias = Callable[[Node], "str | None"]


@dataclass(frozen=True)
class OpSpec:
    """How one op type is converted.

    Attributes:
        fn: The converter; gets the node, its inputs (``None`` for omitted optional inputs) and
            the run context, returns one value per node output.
        version: The newest version of the operator (``since_version`` of its schema) the
            converter implements; models whose opset selects a newer one are rejected.
        check: Optional static check run at import; returns why this node cannot be converted.
    """

    fn: ConverterFn
    version: int
    check: CheckFn | None = None


_OP_FAMILIES = ("ops_activation", "ops_elementwise", "ops_index", "ops_nn", "ops_norm", "ops_quant", "ops_reduce",
                "ops_resize", "ops_rnn", "ops_shape", "ops_tensor")


@functools.cache
def converter_table() -> Mapping[str, OpSpec]:
    """All converters, merged from the ``CONVERTERS`` table of each op-family module."""
    table: dict[str, OpSpec] = {}
    modules = [importlib.import_module(f"{__package__}.{family}") for family in _OP_FAMILIES]
    for module in modules:
        for op_type, spec in module.CONVERTERS.items():
            if op_type in table:
                raise RuntimeError(f"op type {op_type} has two converters ({module.__name__})")
            table[op_type] = spec
    return table


def latest_opset() -> int:
    """The newest default-domain opset the installed onnx package knows."""
    return int(onnx.defs.onnx_opset_version())


def _since_version(op_type: str, opset: int) -> int | None:
    try:
        return int(onnx.defs.get_schema(op_type, opset, "").since_version)
    except onnx.defs.SchemaError:
        return None


@functools.cache
def opset_range(op_type: str) -> tuple[int, int] | None:
    """The contiguous range of model opsets (>= :data:`MIN_OPSET`) in which ``op_type`` converts."""
    spec = converter_table().get(op_type)
    if spec is None:
        return None
    supported = [
        opset
        for opset in range(MIN_OPSET, latest_opset() + 1)
        if (since := _since_version(op_type, opset)) is not None and since <= spec.version
    ]
    return (supported[0], supported[-1]) if supported else None


def check_node(node: Node, domain: str) -> None:
    """Raise :class:`UnsupportedOperatorError` if ``node`` cannot be converted.

    Args:
        node: The node, with the opset of its domain.
        domain: The node's domain (``""`` and ``"ai.onnx"`` are the default domain).
    """
    if domain not in ("", "ai.onnx"):
        raise UnsupportedOperatorError(
            node.name, node.op_type, node.opset, BACKEND, detail="the importer converts default-domain operators only",
            domain=domain,
        )
    spec = converter_table().get(node.op_type)
    if spec is None:
        raise UnsupportedOperatorError(
            node.name, node.op_type, node.opset, BACKEND, detail="no converter for this operator"
        )
    since = _since_version(node.op_type, node.opset)
    if since is None:
        raise UnsupportedOperatorError(
            node.name, node.op_type, node.opset, BACKEND, detail=f"{node.op_type} is not defined in this opset"
        )
    if since > spec.version:
        supported = opset_range(node.op_type)
        span = f"{supported[0]}..{supported[1]}" if supported else "none"
        raise UnsupportedOperatorError(
            node.name,
            node.op_type,
            node.opset,
            BACKEND,
            detail=f"version {since} of the operator is not implemented (supported opsets {span})",
        )
    if spec.check is not None:
        reason = spec.check(node)
        if reason:
            raise UnsupportedOperatorError(node.name, node.op_type, node.opset, BACKEND, detail=reason)
