"""Precision as an ONNX-level transform, decided before any backend builds.

TensorRT 11 removed the precision builder flags and the implicit int8 calibrators: the types
come from the graph (Cast and QuantizeLinear/DequantizeLinear nodes). StreamRT does the same
for every backend, so :func:`apply_precision` returns the ONNX model that all builders consume.

- ``fp32`` / ``tf32``: the model is returned unchanged (tf32 is a kernel choice, not a type).
- ``fp16``: ONNX Runtime's ``convert_float_to_float16`` (shipped in the onnxruntime wheel) casts
  weights and activations to float16, keeping the op types of :func:`fp32_op_types` in float32
  behind Cast pairs, and keeping float32 graph inputs/outputs when ``keep_io_types`` is set.
  Before converting, AutoCast's range rules (:mod:`streamrt.onnx.autocast`) add the nodes whose
  initializers or Constant values overflow float16, or whose activations on real sample data
  exceed 512, to the float32 set; :func:`lower_precision` reports them with their reasons.
- ``bf16``: the same conversion, retyped to bfloat16, with weights rounded from the original
  float32 values, after an upgrade to opset 22 (where Conv and pooling first accept bfloat16).
  No tool in our dependencies converts to bfloat16; see :func:`_to_bf16`. ONNX Runtime's CPU
  provider has no bfloat16 kernels for most ops: bf16 models are for GPU backends.
- ``int8``: ONNX Runtime static quantization in QDQ format (symmetric int8 activations and
  weights, as recommended for GPU/TensorRT), ranges from a calibration folder
  (:mod:`streamrt.onnx.calibration`) and a JSON calibration cache that later builds reuse.

Example:
    >>> cfg = BuildConfig(precision="int8", calibration=CalibrationConfig(data=Path("calib/")))
    >>> q = apply_precision(onnx.load("model.onnx"), cfg, cache_dir=default_cache_dir())
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from streamrt.config import BuildConfig, Precision
from streamrt.errors import BuildError, ConfigError
from streamrt.onnx.autocast import (
    DATA_MAX,
    KeptNode,
    init_max,
    large_activations,
    name_nodes,
    overflowing_constants,
    summary,
)
from streamrt.onnx.lowering import PrecisionResult
from streamrt.onnx.model import subgraphs

__all__ = [
    "FP32_OPS",
    "INT8_OP_TYPES",
    "PrecisionResult",
    "apply_precision",
    "fp32_op_types",
    "int8_op_types",
    "lower_precision",
]

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]
Feeds = Sequence[Mapping[str, np.ndarray]]

#: Op types kept in float32 by the fp16/bf16 conversion, on top of ONNX Runtime's own block list
#: (``float16.DEFAULT_OP_BLOCK_LIST``: ML ops, TopK, NonMaxSuppression, RoiAlign, Range, CumSum,
#: Min, Max, Upsample). It follows torch.autocast's "runs in float32" list: sums over many terms
#: (reductions, cumulative sums, normalisation statistics) overflow float16's 65504 or drop small
#: addends; exp/log/pow overflow (exp(x) > 65504 for x > 11.1); softmax is exp plus a sum; and
#: variance epsilons such as 1e-12 underflow. These ops are cheap next to Conv/MatMul, so the
#: Cast pairs around them cost little. Conv, MatMul, Gemm, pooling, BatchNormalization and
#: element-wise ops run in low precision (GPU kernels accumulate them in float32).
FP32_OPS: tuple[str, ...] = (
    "Acos", "Asin", "Cosh", "Sinh", "Tan",
    "Exp", "Log", "Pow", "Sqrt", "Reciprocal", "Softplus",
    "Softmax", "LogSoftmax",
    "LayerNormalization", "GroupNormalization", "InstanceNormalization", "LpNormalization",
    "ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceProd",
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "CumSum",
)  # fmt: skip

#: Op types whose inputs and weights get Q/DQ nodes in int8: the compute-heavy ops where int8
#: pays. Leaving element-wise ops, pooling and outputs in float matches TensorRT's explicit
#: quantization guidance (Q/DQ on the inputs of Conv/MatMul, fused with what follows).
INT8_OP_TYPES: tuple[str, ...] = ("Conv", "ConvTranspose", "Gemm", "MatMul")

_CHECKER_LIMIT = 2_000_000_000  # protobuf cannot serialise a model above 2 GB for the checker


def apply_precision(
    model: onnx.ModelProto,
    config: BuildConfig,
    *,
    cache_dir: Path,
    progress: Progress | None = None,
    int8_style: str = "tensorrt",
    feeds: Feeds = (),
) -> onnx.ModelProto:
    """Return ``model`` transformed to ``config.precision``; every backend builds from the result.

    The input model is never modified: fp32/tf32 return the same object, other precisions a new
    one that passes the ONNX checker. Intermediate files live in a temporary folder that is
    removed on success and failure; the only files written under the user's paths are the
    calibration cache and its TensorRT-style tables, each atomically. :func:`lower_precision`
    returns the same model with the report of what was kept in float32.

    Args:
        model: a float32 ONNX model.
        config: the build settings (precision, keep_io_types, fp32_ops, calibration).
        cache_dir: root of StreamRT's caches; int8 ranges go to ``<cache_dir>/calibration/``
            unless ``config.calibration.cache`` names a file (or folder).
        progress: called with one-line status messages (conversion steps, calibration samples).
        int8_style: the Q/DQ layout the target backend fuses (``Backend.int8_style``; see
            :func:`streamrt.onnx.quantize.quantize_int8`).
        feeds: sample inputs (real data: calibration samples or ``--sample-inputs``): fp16 keeps
            nodes whose activations exceed :data:`~streamrt.onnx.autocast.DATA_MAX` on them in
            float32, and int8's sensitivity pass measures on them.

    Returns:
        The transformed model.

    Raises:
        CalibrationError: int8 calibration data is missing, empty, unreadable or mismatched.
        MissingDependencyError: image calibration data without Pillow.
        BuildError: a conversion failed or produced an invalid model.
    """
    return lower_precision(
        model, config, cache_dir=cache_dir, progress=progress, int8_style=int8_style, feeds=feeds
    ).model


def lower_precision(
    model: onnx.ModelProto,
    config: BuildConfig,
    *,
    cache_dir: Path,
    progress: Progress | None = None,
    int8_style: str = "tensorrt",
    feeds: Feeds = (),
) -> PrecisionResult:
    """:func:`apply_precision` with its report: the nodes kept in float32 and why."""
    report = progress or (lambda message: None)
    if config.precision is Precision.INT8:
        return _to_int8(model, config, cache_dir, report, int8_style, feeds)
    return _TRANSFORMS[config.precision](model, config, report, feeds)


def fp32_op_types(config: BuildConfig) -> list[str]:
    """Op types the fp16/bf16 conversion keeps in float32: ORT's list, :data:`FP32_OPS`, ``fp32_ops``."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    return sorted({*DEFAULT_OP_BLOCK_LIST, *FP32_OPS, *config.fp32_ops})


def int8_op_types(config: BuildConfig) -> list[str]:
    """Op types quantized to int8: :data:`INT8_OP_TYPES` minus ``config.fp32_ops``."""
    return [op for op in INT8_OP_TYPES if op not in config.fp32_ops]


# --- fp32 / fp16 / bf16 -----------------------------------------------------------------------


def _unchanged(model: onnx.ModelProto, config: BuildConfig, report: Progress, feeds: Feeds) -> PrecisionResult:
    return PrecisionResult(model)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _convert_fp16(
    model: onnx.ModelProto, config: BuildConfig, blocked: list[str], nodes: Sequence[str] = ()
) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    try:
        converted: onnx.ModelProto = convert_float_to_float16(
            model, keep_io_types=config.keep_io_types, op_block_list=blocked, node_block_list=list(nodes)
        )
    except Exception as exc:  # the converter raises bare ValueError/AssertionError/onnx errors
        raise BuildError(f"float16 conversion failed: {type(exc).__name__}: {exc}") from exc
    _drop_round_trips(converted)
    _toposort(converted.graph)  # the converter appends its Cast nodes at the end of the graph
    return converted


def _drop_round_trips(model: onnx.ModelProto) -> None:
    """Bypass the fp32 -> fp16 -> fp32 Cast pairs the converter leaves after fp32-kept ops.

    The converter casts every fp32-kept op's output to float16, even when the consumer is another
    fp32-kept op or a float32 graph output; an fp32 ReduceSum of 1e5 then still ends as inf. The
    outer Cast becomes an Identity of the float32 source, and the inner Cast goes when unused.
    """
    if model.ByteSize() > _CHECKER_LIMIT:
        return
    graph = model.graph
    inferred = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.input, *inferred.value_info)}
    producers = {out: node for node in graph.node for out in node.output}
    bypassed = []
    for outer in graph.node:
        inner = producers.get(outer.input[0]) if outer.op_type == "Cast" and outer.input else None
        if (
            inner is not None
            and inner.op_type == "Cast"
            and _cast_to(outer) == onnx.TensorProto.FLOAT
            and _cast_to(inner) == onnx.TensorProto.FLOAT16
            and types.get(inner.input[0]) == onnx.TensorProto.FLOAT
        ):
            outer.op_type = "Identity"
            del outer.attribute[:]
            outer.input[0] = inner.input[0]
            bypassed.append(inner)
    used = {o.name for o in graph.output} | set().union(*(_reads(n) for n in graph.node))
    for node in bypassed:
        if node.output[0] not in used and node in graph.node:
            graph.node.remove(node)


def _cast_to(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "to"), -1)


def _free_names(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph reads from its enclosing scope."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(_reads(node))
        defined.update(node.output)
    return used - defined


def _reads(node: onnx.NodeProto) -> set[str]:
    names = {name for name in node.input if name}
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else attr.graphs:
            names |= _free_names(sub)
    return names


def _toposort(graph: onnx.GraphProto) -> None:
    """Order nodes so each runs after its producers (stable: ties keep the original order)."""
    nodes = list(graph.node)
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    users: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, node in enumerate(nodes):
        for j in {producer[name] for name in _reads(node) if name in producer} - {i}:
            users[j].append(i)
            waiting[i] += 1
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for user in users[i]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(nodes):
        raise BuildError("the converted graph has a cycle", hint="report the model to StreamRT")
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)


def _guarded(
    work: onnx.ModelProto, low: int, config: BuildConfig, feeds: Feeds
) -> tuple[list[KeptNode], list[str]]:
    """The nodes AutoCast's range rules keep in fp32 (see :mod:`streamrt.onnx.autocast`), and op types."""
    name_nodes(work.graph)
    kept = {k.name: k for k in overflowing_constants(work, init_max(low))}
    if low == onnx.TensorProto.FLOAT16 and feeds:
        for k in large_activations(work, feeds, DATA_MAX):
            kept.setdefault(k.name, k)
    ops = fp32_op_types(config)
    return [k for k in kept.values() if k.op_type not in ops], ops


def _result(what: str, converted: onnx.ModelProto, kept: list[KeptNode], ops: list[str]) -> PrecisionResult:
    record = summary(kept, ops, converted)
    constants = sum(1 for k in kept if "sample data" not in k.reason)
    line = (
        f"{what}: {len(kept)} node(s) kept in fp32 by value range ({constants} overflowing constants or "
        f"their consumers, {len(kept) - constants} large activations), {record['kept_by_op_type']} by op type"
    )
    details = tuple(f"{what}: kept {k.name} ({k.op_type}) in fp32: {k.reason}" for k in kept)
    return PrecisionResult(converted, line, details, {"precision": what, **record})


def _to_fp16(model: onnx.ModelProto, config: BuildConfig, report: Progress, feeds: Feeds) -> PrecisionResult:
    work = _copy(model)
    kept, ops = _guarded(work, onnx.TensorProto.FLOAT16, config, feeds)
    report(f"fp16: converting, keeping {len(ops)} op types and {len(kept)} out-of-range nodes in fp32")
    converted = _convert_fp16(work, config, ops, [k.name for k in kept])
    _check(converted, "fp16")
    return _result("fp16", converted, kept, ops)


_BF16_TAG = "streamrt-bf16:"


def _to_bf16(model: onnx.ModelProto, config: BuildConfig, report: Progress, feeds: Feeds) -> PrecisionResult:
    """bfloat16 through the float16 converter, then retyped.

    No maintained converter in our dependencies writes bfloat16 (onnxconverter-common and ORT's
    ``float16`` only write float16; NVIDIA ModelOpt AutoCast does, but is a heavy, GPU-oriented
    dependency). Reusing the float16 converter keeps one graph-rewriting logic (block list,
    Cast insertion, keep_io_types); every float16 type, Cast target and dtype attribute is then
    retyped to bfloat16, and weights are rounded from their original float32 values (tagged
    through the conversion), so nothing is clamped to float16's range on the way.
    """
    report(f"bf16: converting, keeping {len(fp32_op_types(config))} op types in fp32")
    if _has_float16(model.graph):
        raise BuildError(
            "bf16 conversion of a model that already holds float16 tensors is not supported",
            hint="export the model in float32, or use precision fp16",
        )
    work, no_bf16 = _bf16_opset(model)
    kept, ops = _guarded(work, onnx.TensorProto.BFLOAT16, config, feeds)
    if no_bf16:
        logger.info("bf16: keeping %s in fp32: opset %d gives them no bfloat16 type", no_bf16, _opset(work))
    originals: list[tuple[np.ndarray, str]] = []
    for tensor in _tensors(work.graph):
        if tensor.data_type == onnx.TensorProto.FLOAT:
            originals.append((onnx.numpy_helper.to_array(tensor), tensor.doc_string))
            tensor.doc_string = f"{_BF16_TAG}{len(originals) - 1}"
    converted = _convert_fp16(work, config, sorted({*ops, *no_bf16}), [k.name for k in kept])
    for tensor in _tensors(converted.graph):
        original = None
        if tensor.doc_string.startswith(_BF16_TAG):
            original, tensor.doc_string = originals[int(tensor.doc_string[len(_BF16_TAG) :])]
        if tensor.data_type == onnx.TensorProto.FLOAT16:
            values = onnx.numpy_helper.to_array(tensor) if original is None else original
            _set_bf16(tensor, values)
    _retype_graph(converted.graph)
    _check(converted, "bf16")
    return _result("bf16", converted, kept, sorted({*ops, *no_bf16}))


_BF16_OPSET = 22  # opset 22 added bfloat16 to Conv, pooling and most remaining float ops


def _opset(model: onnx.ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)


def _bf16_opset(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Upgrade to opset 22 where possible; list the op types that still have no bfloat16 type."""
    work = _copy(model)
    if _opset(work) < _BF16_OPSET:
        try:
            work = onnx.version_converter.convert_version(work, _BF16_OPSET)
        except Exception as exc:  # the converter lacks adapters for some ops and patterns
            logger.info("bf16: kept opset %d (upgrade to %d failed: %s)", _opset(work), _BF16_OPSET, exc)
    opset = _opset(work)
    ops = {n.op_type for g in subgraphs(work.graph) for n in g.node if n.domain in ("", "ai.onnx")}
    return work, sorted(op for op in ops if not _allows_bf16(op, opset))


def _allows_bf16(op_type: str, opset: int) -> bool:
    """Whether the op's first input may be bfloat16 at ``opset`` (True when it takes no float)."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return True
    if not schema.inputs:
        return True
    type_str = schema.inputs[0].type_str
    allowed = next((c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == type_str), [type_str])
    return "tensor(float)" not in allowed or "tensor(bfloat16)" in allowed


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    for g in subgraphs(graph):
        yield from g.initializer
        for node in g.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors


def _has_float16(graph: onnx.GraphProto) -> bool:
    fp16 = onnx.TensorProto.FLOAT16
    for g in subgraphs(graph):
        for value in (*g.input, *g.output, *g.value_info):
            if value.type.tensor_type.elem_type == fp16:
                return True
        if any(attr.name in ("to", "dtype") and attr.i == fp16 for node in g.node for attr in node.attribute):
            return True
    return any(t.data_type == fp16 for t in _tensors(graph))


def _set_bf16(tensor: onnx.TensorProto, values: np.ndarray) -> None:
    import ml_dtypes  # ships with onnx

    tensor.data_type = onnx.TensorProto.BFLOAT16
    del tensor.float_data[:]
    del tensor.int32_data[:]
    tensor.raw_data = np.ascontiguousarray(values, dtype=np.float32).astype(ml_dtypes.bfloat16).tobytes()


def _retype_graph(graph: onnx.GraphProto) -> None:
    fp16, bf16 = onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16
    for g in subgraphs(graph):
        for value in (*g.input, *g.output, *g.value_info):
            if value.type.tensor_type.elem_type == fp16:
                value.type.tensor_type.elem_type = bf16
            seq = value.type.sequence_type.elem_type.tensor_type
            if value.type.HasField("sequence_type") and seq.elem_type == fp16:
                seq.elem_type = bf16
        for node in g.node:
            for attr in node.attribute:
                if attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT and attr.i == fp16:
                    attr.i = bf16


def _to_int8(
    model: onnx.ModelProto, config: BuildConfig, cache_dir: Path, report: Progress, style: str, feeds: Feeds
) -> PrecisionResult:
    from streamrt.onnx.quantize import quantize_int8

    if config.calibration is None:  # BuildConfig refuses this already; kept for direct callers
        raise ConfigError("precision int8 needs calibration data", hint="pass --calib DIR")
    ops = int8_op_types(config)
    if not ops:
        raise ConfigError(
            f"fp32_ops {list(config.fp32_ops)} excludes every int8 op type {list(INT8_OP_TYPES)}",
            hint="remove some of them from fp32_ops, or build with precision fp16",
        )
    result = quantize_int8(
        model,
        config.calibration,
        ops,
        cache_dir=cache_dir,
        progress=report,
        style=style,
        target=config.int8_target,
        feeds=feeds,
    )
    _check(result.model, "int8")
    return result


def _check(model: onnx.ModelProto, what: str) -> None:
    if model.ByteSize() > _CHECKER_LIMIT:
        logger.debug("skipping the ONNX checker on the %s model: above 2 GB", what)
        return
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # ValidationError and InferenceError
        raise BuildError(
            f"the {what} model fails the ONNX checker: {exc}",
            hint="add the op types involved to fp32_ops, or report the model to StreamRT",
        ) from exc


_TRANSFORMS: dict[Precision, Callable[[onnx.ModelProto, BuildConfig, Progress, Feeds], PrecisionResult]] = {
    Precision.FP32: _unchanged,
    Precision.TF32: _unchanged,
    Precision.FP16: _to_fp16,
    Precision.BF16: _to_bf16,
}
