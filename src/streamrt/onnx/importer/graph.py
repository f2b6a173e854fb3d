"""The interpreter module: an ``nn.Module`` that runs an ONNX graph node by node.

:class:`OnnxModule` holds the graph's initializers (and ``Constant`` node values) as buffers and,
in ``forward``, walks the nodes in order, calling each op type's converter from
:func:`~.registry.converter_table`. Tracing it with ``torch.export`` unrolls the walk into a flat
FX graph of ATen ops; the Python bookkeeping (the value table, shape values) disappears.
"""

from __future__ import annotations

import functools
import inspect
import keyword
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from streamrt.errors import InvalidModelError, UnsupportedOperatorError

from .registry import BACKEND, MIN_OPSET, Node, RunContext, check_node, converter_table
from .values import SHAPE_VALUE_MAX_ELEMENTS, ShapeValue, Value, numpy_to_torch, onnx_to_torch_dtype, to_tensor

__all__ = ["InputInfo", "OnnxModule", "load_model", "model_nodes", "parse_attributes"]

logger = logging.getLogger(__name__)

_DEFAULT_DOMAINS = ("", "ai.onnx")
# Dtypes whose small constants are also kept as Python values (see values.ShapeValue).
_PY_DTYPES = frozenset(
    {torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64}
    | {torch.float16, torch.bfloat16, torch.float32, torch.float64}
)


@dataclass(frozen=True)
class InputInfo:
    """One graph input as declared in the ONNX model.

    Attributes:
        name: The ONNX value name.
        arg_name: The Python parameter name of ``OnnxModule.forward`` (a sanitised ``name``).
        dtype: The torch dtype.
        shape: Dimensions: ints for fixed sizes, a string for a named dynamic dimension
            (``dim_param``), ``None`` for an unnamed dynamic one.
    """

    name: str
    arg_name: str
    dtype: torch.dtype
    shape: tuple[int | str | None, ...]


@dataclass(frozen=True)
class _Constant:
    name: str
    buffer: str
    items: tuple[Any, ...] | None  # Python elements for small 0-D/1-D constants
    scalar: bool
    dtype: torch.dtype


@dataclass(frozen=True)
class _Step:
    node: Node
    release: tuple[str, ...]  # values whose last use is this node


def load_model(model: onnx.ModelProto | str | Any) -> onnx.ModelProto:
    """Return ``model`` as a ``ModelProto``, loading it (with external data) from a path."""
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(str(model))
    except FileNotFoundError:
        from streamrt.errors import ModelNotFoundError

        raise ModelNotFoundError(f"no ONNX model at {str(model)!r}") from None
    except Exception as exc:
        raise InvalidModelError(f"cannot read {str(model)!r} as an ONNX model: {exc}") from exc


def default_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset, checked against :data:`~.registry.MIN_OPSET`."""
    versions = [imp.version for imp in model.opset_import if imp.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise InvalidModelError("the model imports no default-domain (ai.onnx) opset")
    opset = int(versions[0])
    if opset < MIN_OPSET:
        raise InvalidModelError(
            f"the model uses opset {opset}; the torch importer supports opset {MIN_OPSET} and newer",
            hint=f"convert it first: onnx.version_converter.convert_version(model, {MIN_OPSET})",
        )
    return opset


def parse_attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """Attributes as Python values: strings decoded, tensors as NumPy arrays."""
    attrs: dict[str, Any] = {}
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8") for v in value]
        attrs[attr.name] = value
    return attrs


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    """ONNX element type of every value the model declares (plus what shape inference adds)."""
    graph = model.graph
    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # inference is a bonus; declared types below still apply
        logger.debug("ONNX shape inference failed; using declared value types only", exc_info=True)
    types: dict[str, int] = {}
    for value in [*graph.value_info, *graph.input, *graph.output]:
        if value.type.HasField("tensor_type"):
            types[value.name] = int(value.type.tensor_type.elem_type)
    for init in model.graph.initializer:
        types[init.name] = int(init.data_type)
    for proto in model.graph.node:
        if proto.op_type == "Constant":
            for attr in proto.attribute:
                if attr.name == "value":
                    types[proto.output[0]] = int(attr.t.data_type)
    return types


def model_nodes(model: onnx.ModelProto) -> list[tuple[Node, str]]:
    """The top-level nodes of ``model`` as :class:`Node` objects, each with its domain."""
    opsets = {imp.domain: int(imp.version) for imp in model.opset_import}
    default = next((opsets[d] for d in _DEFAULT_DOMAINS if d in opsets), 0)
    types = _element_types(model)
    nodes = []
    for index, proto in enumerate(model.graph.node):
        domain = proto.domain
        opset = default if domain in _DEFAULT_DOMAINS else opsets.get(domain, 0)
        node = Node(
            name=proto.name or f"{proto.op_type}#{index}",
            op_type=proto.op_type,
            opset=opset,
            attrs=parse_attributes(proto),
            inputs=tuple(proto.input),
            outputs=tuple(proto.output),
            input_types=tuple(types.get(name, 0) for name in proto.input),
        )
        nodes.append((node, domain))
    return nodes


def _constant_array(node: Node) -> np.ndarray:
    """The value of a ``Constant`` node (its one value attribute)."""
    attrs = node.attrs
    if "value" in attrs:
        return np.asarray(attrs["value"])
    table = {
        "value_float": np.float32,
        "value_floats": np.float32,
        "value_int": np.int64,
        "value_ints": np.int64,
    }
    for key, dtype in table.items():
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    raise UnsupportedOperatorError(
        node.name, node.op_type, node.opset, BACKEND, detail=f"unsupported Constant attributes {sorted(attrs)}"
    )


def _arg_names(names: Sequence[str]) -> list[str]:
    """Valid, unique Python identifiers for the ONNX input names (``forward``'s parameters)."""
    out: list[str] = []
    for name in names:
        arg = re.sub(r"\W", "_", name) or "input"
        if arg[0].isdigit() or keyword.iskeyword(arg) or arg == "self":
            arg = f"input_{arg}"
        base, k = arg, 1
        while arg in out:
            arg, k = f"{base}_{k}", k + 1
        out.append(arg)
    return out


def _input_info(value: onnx.ValueInfoProto, arg_name: str) -> InputInfo:
    ttype = value.type.tensor_type
    dims: list[int | str | None] = []
    for dim in ttype.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or None)
    return InputInfo(value.name, arg_name, onnx_to_torch_dtype(ttype.elem_type), tuple(dims))


def _run(module: OnnxModule, *inputs: torch.Tensor, **named: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if named:
        args = list(inputs)
        for arg in module.arg_names[len(args) :]:
            if arg not in named:
                break
            args.append(named.pop(arg))
        if named:
            from streamrt.errors import UnknownInputError

            raise UnknownInputError(f"unknown inputs {sorted(named)}; the model takes {list(module.arg_names)}")
        inputs = tuple(args)
    return module.run(*inputs)


class OnnxModule(torch.nn.Module):
    """An ONNX graph as a ``torch.nn.Module``.

    ``forward`` takes the graph inputs positionally, in ONNX graph-input order (initializers
    excluded; parameter names are the sanitised ONNX names, see :attr:`arg_names`), and returns
    a tuple with one tensor per graph output. Initializers and ``Constant`` values are buffers,
    so ``.to(device)`` moves them and ``torch.export`` treats them as weights; small integer
    constants (shapes, axes, indices) are plain Python values. Precision is the ONNX graph's:
    convert fp16/bf16 in ONNX (``streamrt.onnx.precision``), not with ``.half()`` here.

    Example:
        >>> module = OnnxModule(onnx.load("model.onnx"))       # doctest: +SKIP
        >>> (logits,) = module(torch.randn(1, 3, 224, 224))    # doctest: +SKIP
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        """Check every node against the converter table, then register the constants.

        Raises:
            InvalidModelError: Opset older than 11, or a malformed graph.
            UnsupportedOperatorError: The first node that has no converter.
        """
        super().__init__()
        default_opset(model)
        nodes = model_nodes(model)
        for node, domain in nodes:
            check_node(node, domain)
        graph = model.graph
        self._consts: list[_Constant] = []
        self._buffer_names: set[str] = set()
        for init in graph.initializer:
            self._add_constant(init.name, numpy_helper.to_array(init))
        if len(graph.sparse_initializer):
            raise InvalidModelError("sparse initializers are not supported by the torch importer")
        initializer_names = {c.name for c in self._consts}
        run_nodes = []
        for node, _domain in nodes:
            if node.op_type == "Constant":
                self._add_constant(node.outputs[0], _constant_array(node))
            else:
                run_nodes.append(node)
        inputs = [v for v in graph.input if v.name not in initializer_names]
        args = _arg_names([v.name for v in inputs])
        self._inputs = tuple(_input_info(v, a) for v, a in zip(inputs, args, strict=True))
        self._outputs = tuple(v.name for v in graph.output)
        self._steps = self._plan(run_nodes)
        self._table = converter_table()
        forward = functools.partial(_run, self)
        params = [inspect.Parameter(a, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in args]
        forward.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        # A per-instance forward with the graph's input names as parameters, so that
        # torch.export's dynamic_shapes can be keyed by name or given as a plain tuple.
        self.__dict__["forward"] = forward

    @property
    def input_names(self) -> tuple[str, ...]:
        """ONNX graph-input names, in ``forward`` argument order."""
        return tuple(i.name for i in self._inputs)

    @property
    def arg_names(self) -> tuple[str, ...]:
        """``forward``'s parameter names (ONNX input names made valid identifiers)."""
        return tuple(i.arg_name for i in self._inputs)

    @property
    def inputs(self) -> tuple[InputInfo, ...]:
        """Declared dtype and shape of each graph input."""
        return self._inputs

    @property
    def output_names(self) -> tuple[str, ...]:
        """ONNX graph-output names, in the order ``forward`` returns them."""
        return self._outputs

    def _add_constant(self, name: str, array: np.ndarray) -> None:
        tensor = numpy_to_torch(array)
        items: tuple[Any, ...] | None = None
        if tensor.dim() <= 1 and tensor.numel() <= SHAPE_VALUE_MAX_ELEMENTS and tensor.dtype in _PY_DTYPES:
            items = tuple(tensor.reshape(-1).tolist())
            if not tensor.is_floating_point():
                # Small integer constants are shape arithmetic (axes, shapes, indices): Python
                # values only; one used as a tensor becomes a constant where it is used.
                self._consts.append(_Constant(name, "", items, tensor.dim() == 0, tensor.dtype))
                return
        buffer = re.sub(r"\W", "_", f"c_{name}")
        base, k = buffer, 1
        while buffer in self._buffer_names:
            buffer, k = f"{base}_{k}", k + 1
        self._buffer_names.add(buffer)
        self.register_buffer(buffer, tensor)
        self._consts.append(_Constant(name, buffer, items, tensor.dim() == 0, tensor.dtype))

    def _plan(self, nodes: list[Node]) -> tuple[_Step, ...]:
        last_use: dict[str, int] = {}
        for index, node in enumerate(nodes):
            for name in node.inputs:
                if name:
                    last_use[name] = index
        keep = set(self._outputs)
        releases: dict[int, list[str]] = {}
        for name, index in last_use.items():
            if name not in keep:
                releases.setdefault(index, []).append(name)
        return tuple(_Step(node, tuple(releases.get(i, ()))) for i, node in enumerate(nodes))

    def _anchor_device(self, inputs: Sequence[torch.Tensor]) -> torch.device:
        for tensor in inputs:
            return tensor.device
        for buffer in self.buffers():
            return buffer.device
        return torch.device("cpu")

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run the graph (replaced per instance by a wrapper with named parameters)."""
        return self.run(*inputs)

    def run(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Interpret the graph on ``inputs`` (in graph-input order); one tensor per output."""
        if len(inputs) != len(self._inputs):
            from streamrt.errors import MissingInputError

            raise MissingInputError(
                f"the model takes {len(self._inputs)} inputs {list(self.input_names)}, got {len(inputs)}"
            )
        ctx = RunContext(self._anchor_device(inputs))
        env: dict[str, Value] = {}
        buffers = dict(self.named_buffers())
        for const in self._consts:
            backing = buffers[const.buffer] if const.buffer else None
            if const.items is not None:
                env[const.name] = ShapeValue(const.items, const.dtype, const.scalar, backing)
            elif backing is not None:
                env[const.name] = backing
        for info, tensor in zip(self._inputs, inputs, strict=True):
            env[info.name] = tensor
        for step in self._steps:
            node = step.node
            args = [env[name] if name else None for name in node.inputs]
            try:
                results = self._table[node.op_type].fn(node, args, ctx)
            except Exception as exc:
                if hasattr(exc, "add_note"):
                    exc.add_note(f"while running ONNX node '{node.name}' ({node.op_type})")
                raise
            for name, value in zip(node.outputs, results, strict=False):
                if name and value is not None:
                    env[name] = value
            for name in step.release:
                env.pop(name, None)
        return tuple(to_tensor(env[name], ctx.device) for name in self._outputs)
