"""A torch_inductor plan's output specs, read from the exported programs' symbolic shapes.

``torch.export`` traces each shape profile with a ``SymInt`` for every dynamic input dimension,
and the user outputs' fake tensors (``node.meta["val"]``) carry shapes in those symbols: a
classifier over a ``1..64`` batch profile gives ``logits`` the shape ``[s0, 1000]``. A dimension
with a free symbol (``s0``, ``2*s0``, ``s0 // 2``, a data-dependent size) is recorded as ``-1``;
one without stays concrete. Over several profiles a dimension is ``-1`` when any profile makes it
symbolic or the profiles give it different sizes.

Why not run the module once on the example input (what :func:`streamrt.build_module` did): that
records ``64x1000`` for a ``1..64`` batch profile, and the model server then refuses to batch the
plan ("'logits' has no dynamic batch dimension") although the compiled kernels answer any batch.

Module builds name the outputs themselves (:func:`named`); ONNX builds keep the graph's names and
dtypes and take the compiled shapes where the graph declares less (:func:`refine_declared`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from streamrt.errors import BuildError, ConfigError
from streamrt.types import DType, TensorSpec, format_shape

__all__ = ["CompiledOutput", "exported_outputs", "merge_profiles", "named", "refine_declared"]

log = logging.getLogger(__name__)

CompiledOutput = tuple[tuple[int, ...], DType]
"""One user output of one exported program: shape with ``-1`` for symbolic dims, and dtype."""


def _dim(size: int | torch.SymInt) -> int:
    from torch.fx.experimental.symbolic_shapes import free_symbols

    if isinstance(size, torch.SymInt):
        if free_symbols(size):
            return -1
        return int(size)  # a SymInt that simplified to a constant
    return int(size)


def exported_outputs(ep: torch.export.ExportedProgram) -> list[CompiledOutput]:
    """The user outputs of ``ep`` in order: shape (symbolic dims as ``-1``) and dtype.

    Raises:
        BuildError: an output is not a tensor (a Python number or None): a plan's outputs are tensors.
    """
    from torch.export.graph_signature import OutputKind

    nodes = ep.graph.output_node().args[0]
    specs = ep.graph_signature.output_specs
    outputs: list[CompiledOutput] = []
    for index, (node, spec) in enumerate(zip(nodes, specs, strict=True)):
        if spec.kind is not OutputKind.USER_OUTPUT:
            continue  # buffer mutations and the like: not returned to the caller
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
        if not isinstance(value, torch.Tensor):
            raise BuildError(
                f"output {index} of the exported program is {type(value).__name__}, not a tensor",
                hint="return tensors only from forward() (wrap numbers with torch.tensor)",
            )
        outputs.append((tuple(_dim(d) for d in value.shape), DType.from_any(value.dtype)))
    return outputs


def merge_profiles(per_profile: Sequence[Sequence[CompiledOutput]]) -> list[CompiledOutput]:
    """One shape per output over every profile: ``-1`` where any profile is symbolic or sizes differ.

    Raises:
        BuildError: profiles disagree on the number of outputs, an output's rank or dtype.
    """
    if not per_profile:
        return []
    first = list(per_profile[0])
    for i, outputs in enumerate(per_profile[1:], start=2):
        if len(outputs) != len(first):
            raise BuildError(f"profile {i} exports {len(outputs)} outputs, profile 1 exports {len(first)}",
                             hint="a model's outputs must not depend on which profile runs it")
    merged = []
    for k, (shape, dtype) in enumerate(first):
        dims = list(shape)
        for i, outputs in enumerate(per_profile[1:], start=2):
            other, other_dtype = outputs[k]
            if len(other) != len(dims) or other_dtype is not dtype:
                raise BuildError(
                    f"output {k} is {dtype.value} {format_shape(shape)} in profile 1 but "
                    f"{other_dtype.value} {format_shape(other)} in profile {i}",
                    hint="a model's outputs must keep their rank and dtype across profiles",
                )
            dims = [d if d == o else -1 for d, o in zip(dims, other, strict=True)]
        merged.append((tuple(dims), dtype))
    return merged


def named(compiled: Sequence[TensorSpec], names: Sequence[str] | None) -> tuple[TensorSpec, ...]:
    """The compiled outputs under the caller's names (``output_<i>`` when ``names`` is None).

    Raises:
        ConfigError: ``names`` does not name every output once.
    """
    if names is None:
        return tuple(compiled)
    names = list(names)
    if len(names) != len(compiled):
        raise ConfigError(
            f"output_names has {len(names)} names ({', '.join(names)}) but the module returns "
            f"{len(compiled)} outputs",
            hint=f"give exactly {len(compiled)} output names, in the order forward() returns them",
        )
    return tuple(TensorSpec(n, s.dtype, s.shape) for n, s in zip(names, compiled, strict=True))


def refine_declared(declared: Sequence[TensorSpec], compiled: Sequence[TensorSpec]) -> tuple[TensorSpec, ...]:
    """An ONNX graph's declared outputs, with the shapes the compiled plan actually returns.

    Names and dtypes stay the graph's. A dimension is ``-1`` when the graph declares it symbolic or
    the exported program makes it follow a dynamic input (a graph that declares ``64`` for a batch
    its input leaves dynamic still answers any batch); otherwise it is the compiled size. An output
    whose declared rank differs from the compiled one (a graph without output shapes reads as rank
    0) takes the compiled shape. When the counts differ the declaration is kept, with a warning.
    """
    if not compiled:
        return tuple(declared)
    if len(compiled) != len(declared):
        log.warning("the compiled program returns %d outputs, the ONNX graph declares %d; keeping the declared "
                    "output shapes", len(compiled), len(declared))
        return tuple(declared)
    refined = []
    for want, got in zip(declared, compiled, strict=True):
        if len(want.shape) != len(got.shape):
            shape = got.shape
        else:
            shape = tuple(-1 if w < 0 or g < 0 else g for w, g in zip(want.shape, got.shape, strict=True))
        if shape != want.shape:
            log.info("output '%s': the graph declares %s, the compiled plan returns %s",
                     want.name, format_shape(want.shape), format_shape(shape))
        refined.append(TensorSpec(want.name, want.dtype, shape))
    return tuple(refined)
