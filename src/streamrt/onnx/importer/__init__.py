"""StreamRT's ONNX -> torch importer (the parser of the ``torch_inductor`` backend).

An ONNX model becomes an :class:`OnnxModule`, an ``nn.Module`` that interprets the graph node by
node with one converter per op type; ``torch.export`` flattens it into a clean FX graph of ATen
ops, with dynamic dims where asked. Shape arithmetic in the graph (``Shape -> Gather -> Concat ->
Reshape``) stays symbolic, so dynamic batch and H/W export without data-dependent ops.

Example:
    >>> from streamrt.onnx.importer import import_onnx, to_fx
    >>> module = import_onnx("yolo.onnx")                                  # doctest: +SKIP
    >>> boxes, = module(torch.randn(2, 3, 640, 640))                       # doctest: +SKIP
    >>> batch = torch.export.Dim("batch", min=1, max=64)                   # doctest: +SKIP
    >>> gm = to_fx(module, (torch.randn(2, 3, 640, 640),), ({0: batch},))  # doctest: +SKIP

Unsupported operators are reported by :func:`check_supported` (and by :func:`import_onnx`,
before anything is traced) as :class:`~streamrt.errors.UnsupportedOperatorError` naming the node,
the op type and the opset. :func:`supported_ops` lists what converts, with the opset range.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import torch

from .graph import InputInfo, OnnxModule, default_opset, load_model, model_nodes
from .registry import BACKEND, MIN_OPSET, check_node, converter_table, opset_range

__all__ = [
    "BACKEND",
    "MIN_OPSET",
    "InputInfo",
    "OnnxModule",
    "auto_dynamic_shapes",
    "check_supported",
    "export_program",
    "import_onnx",
    "supported_ops",
    "to_fx",
]

ModelLike = onnx.ModelProto | str | Path


def supported_ops() -> dict[str, tuple[int, int]]:
    """Every convertible ONNX op type (default domain) -> (first, last) model opset it converts in.

    Opsets run from :data:`MIN_OPSET` (or the op's introduction) to the newest opset whose
    version of the op the converter implements (at most the newest opset the installed onnx
    package knows).
    """
    out: dict[str, tuple[int, int]] = {}
    for op_type in sorted(converter_table()):
        span = opset_range(op_type)
        if span is not None:
            out[op_type] = span
    return out


def check_supported(model: ModelLike) -> None:
    """Raise for the first node of ``model`` the importer cannot convert.

    Raises:
        InvalidModelError: The model's opset is older than :data:`MIN_OPSET`.
        UnsupportedOperatorError: Names the node, its op type and opset, backend ``torch_inductor``.
    """
    proto = load_model(model)
    default_opset(proto)
    for node, domain in model_nodes(proto):
        check_node(node, domain)


def import_onnx(model: ModelLike) -> OnnxModule:
    """Convert an ONNX model (a ``ModelProto`` or a path) into an :class:`OnnxModule`.

    Every node is checked before anything runs; the module's ``forward`` takes the graph inputs
    positionally, in graph-input order, and returns a tuple of outputs in graph-output order.

    Raises:
        ModelNotFoundError: ``model`` is a path that does not exist.
        InvalidModelError: Unreadable model, or opset older than :data:`MIN_OPSET`.
        UnsupportedOperatorError: A node has no converter (see :func:`supported_ops`).
    """
    return OnnxModule(load_model(model))


def _dim_name(text: str) -> str:
    name = re.sub(r"\W", "_", text) or "dim"
    if name[0].isdigit():
        name = f"d_{name}"
    return name


def auto_dynamic_shapes(module: OnnxModule) -> tuple[dict[int, Any] | None, ...]:
    """``dynamic_shapes`` for ``torch.export`` from the model's declared input shapes.

    A named ONNX dimension (``dim_param``, e.g. ``"batch"``) becomes one ``torch.export.Dim``
    shared by every input that uses the name; an unnamed dynamic dimension becomes
    ``Dim.AUTO``; fixed dimensions stay static.
    """
    dims: dict[str, Any] = {}
    specs: list[dict[int, Any] | None] = []
    for info in module.inputs:
        spec: dict[int, Any] = {}
        for axis, dim in enumerate(info.shape):
            if isinstance(dim, str):
                name = _dim_name(dim)
                spec[axis] = dims.setdefault(name, torch.export.Dim(name))
            elif dim is None:
                spec[axis] = torch.export.Dim.AUTO
        specs.append(spec or None)
    return tuple(specs)


def _normalise_dynamic_shapes(module: OnnxModule, dynamic_shapes: Any) -> Any:
    if dynamic_shapes is None:
        return None
    if isinstance(dynamic_shapes, str):
        if dynamic_shapes != "auto":
            raise ValueError(f"dynamic_shapes must be None, 'auto', a sequence or a mapping, got {dynamic_shapes!r}")
        return auto_dynamic_shapes(module)
    if isinstance(dynamic_shapes, Mapping):
        by_arg = dict(zip(module.input_names, module.arg_names, strict=True))
        return {by_arg.get(k, k): v for k, v in dynamic_shapes.items()}
    return tuple(dynamic_shapes)


def export_program(
    model: ModelLike | OnnxModule,
    example_inputs: Sequence[torch.Tensor],
    dynamic_shapes: Any = None,
) -> torch.export.ExportedProgram:
    """``torch.export`` the imported model (what the AOTInductor build consumes).

    Args:
        model: An ONNX model, a path, or an already imported :class:`OnnxModule`.
        example_inputs: One tensor per graph input. For a dynamic dim use an example size of
            at least 2 (torch specialises sizes 0 and 1).
        dynamic_shapes: ``None`` (static), ``"auto"`` (from the ONNX input shapes, see
            :func:`auto_dynamic_shapes`), a sequence with one ``{axis: Dim}`` (or ``None``) per
            input, or a mapping from ONNX input name (or ``forward`` argument name) to that.
    """
    module = model if isinstance(model, OnnxModule) else import_onnx(model)
    module.eval()
    return torch.export.export(
        module, tuple(example_inputs), dynamic_shapes=_normalise_dynamic_shapes(module, dynamic_shapes)
    )


def to_fx(
    model: ModelLike | OnnxModule,
    example_inputs: Sequence[torch.Tensor],
    dynamic_shapes: Any = None,
) -> torch.fx.GraphModule:
    """ONNX -> ``torch.fx.GraphModule`` through ``torch.export`` (see :func:`export_program`).

    The result is flat ATen ops with the initializers as attributes; call it like the
    :class:`OnnxModule` (positional inputs, tuple of outputs).
    """
    module = export_program(model, example_inputs, dynamic_shapes).module()
    assert isinstance(module, torch.fx.GraphModule)
    return module
