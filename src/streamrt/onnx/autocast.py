"""Which nodes an fp16/bf16 conversion must keep in float32, found from values, not op types.

The rules follow NVIDIA ModelOpt's AutoCast (``modelopt.onnx.autocast``), whose package we do
not depend on (it pins onnx and onnxruntime-gpu versions and needs torch and cupy):

- **Initializer range** (``init_max``): every float initializer *and every Constant node value*
  whose magnitude exceeds the low-precision type's largest finite value (65504 for float16)
  would be clamped by the conversion. The Constant node and every consumer of the value stay in
  float32; values are followed through data-movement ops (Reshape, Unsqueeze, Identity...),
  whose consumers stay too. A BatchNormalization with running variances of 1e7 fed by a
  ``Constant`` is the case that broke a text detector (cosine 0.43).
- **Activation range** (``data_max`` = 512, fp16 only): with sample data, every node whose input
  or output reaches a magnitude above 512 on the samples (the first four) stays in float32 (AutoCast's
  ``data_max`` default: the headroom to 65504 is what products and sums downstream need).

Each kept node comes with its reason, for the build's report and the plan's manifest.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from streamrt.onnx.model import subgraphs

__all__ = ["DATA_MAX", "KeptNode", "init_max", "large_activations", "name_nodes", "overflowing_constants"]

logger = logging.getLogger(__name__)

#: AutoCast's ``data_max``: activations above this magnitude keep their nodes in float32.
DATA_MAX = 512.0
#: Feeds the activation-range rule runs (every intermediate tensor of a feed is held at once).
_DATA_FEEDS = 4

#: Ops that move values without computing on them: a kept value is followed through them.
PASS_THROUGH = frozenset({
    "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split",
    "Slice", "Gather", "GatherElements", "Expand", "Tile", "Cast", "Pad",
})  # fmt: skip


@dataclass(frozen=True)
class KeptNode:
    """A node the conversion keeps in float32, and why."""

    name: str
    op_type: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "op_type": self.op_type, "reason": self.reason}


def init_max(elem_type: int) -> float:
    """The largest finite value of ``elem_type`` (float16: 65504; bfloat16: ~3.39e38)."""
    import ml_dtypes  # ships with onnx

    numpy_type: Any = ml_dtypes.bfloat16 if elem_type == onnx.TensorProto.BFLOAT16 else np.float16
    return float(ml_dtypes.finfo(numpy_type).max)


def name_nodes(graph: onnx.GraphProto) -> None:
    """Give every unnamed node (in subgraphs too) a unique name: the converter blocks nodes by name."""
    taken = {n.name for g in subgraphs(graph) for n in g.node if n.name}
    counter = 0
    for g in subgraphs(graph):
        for node in g.node:
            if not node.name:
                while f"{node.op_type}_streamrt_{counter}" in taken:
                    counter += 1
                node.name = f"{node.op_type}_streamrt_{counter}"
                taken.add(node.name)


def overflowing_constants(model: onnx.ModelProto, limit: float) -> list[KeptNode]:
    """Nodes that produce or consume an initializer or Constant value above ``limit`` (top graph)."""
    graph = model.graph
    big: dict[str, str] = {}  # tensor name -> reason
    kept: dict[str, KeptNode] = {}
    for init in graph.initializer:
        peak = _peak(init)
        if peak > limit:
            big[init.name] = f"initializer {init.name} reaches |x| = {peak:.3g} > {limit:g}"
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            peak = max((_attr_peak(a) for a in node.attribute), default=0.0)
            if peak > limit:
                reason = f"Constant {node.name} holds |x| = {peak:.3g} > {limit:g}"
                kept[node.name] = KeptNode(node.name, node.op_type, reason)
                big[node.output[0]] = reason
    consumers = _consumers(graph)
    pending = list(big)
    while pending:
        tensor = pending.pop()
        for node in consumers.get(tensor, ()):
            if node.name in kept:
                continue
            kept[node.name] = KeptNode(node.name, node.op_type, f"reads {big[tensor]}")
            if node.op_type in PASS_THROUGH:
                for out in node.output:
                    if out and out not in big:
                        big[out] = big[tensor]
                        pending.append(out)
    return list(kept.values())


def large_activations(
    model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], limit: float = DATA_MAX
) -> list[KeptNode]:
    """Nodes whose float input or output exceeds ``limit`` on ``feeds`` (ONNX Runtime fp32, top graph).

    Returns an empty list, with a warning, when the model cannot run in ONNX Runtime.
    """
    import onnxruntime as ort

    if not feeds:
        return []
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe)
    except Exception as exc:
        logger.warning("fp16 activation-range check skipped: ONNX shape inference failed: %s", exc)
        return []
    float_types = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)
    known = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    outputs = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name and name not in outputs and known.get(name) in float_types:
                probe.graph.output.append(onnx.helper.make_tensor_value_info(name, known[name], None))
                outputs.add(name)
    peaks: dict[str, float] = {}
    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        for feed in feeds[:_DATA_FEEDS]:
            for name, value in zip(names, session.run(names, dict(feed)), strict=True):
                array = np.asarray(value)
                if array.size and array.dtype.kind == "f":
                    peaks[name] = max(peaks.get(name, 0.0), float(np.nanmax(np.abs(array))))
    except Exception as exc:
        logger.warning("fp16 activation-range check skipped: ONNX Runtime could not run the model: %s", exc)
        return []
    for feed in feeds[:_DATA_FEEDS]:
        for name, value in feed.items():
            if np.asarray(value).dtype.kind == "f" and np.asarray(value).size:
                peaks[name] = max(peaks.get(name, 0.0), float(np.nanmax(np.abs(value))))
    kept: list[KeptNode] = []
    for node in model.graph.node:
        if node.op_type == "Constant":
            continue  # a Constant's value is an initializer: the other rule decides
        for role, names in (("output", node.output), ("input", node.input)):
            hit = next((n for n in names if peaks.get(n, 0.0) > limit), None)
            if hit is not None:
                reason = f"{role} {hit} reaches |x| = {peaks[hit]:.3g} > {limit:g} on the sample data"
                kept.append(KeptNode(node.name, node.op_type, reason))
                break
    return kept


def _peak(tensor: onnx.TensorProto) -> float:
    if tensor.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        return 0.0
    if tensor.data_location == onnx.TensorProto.EXTERNAL and not tensor.raw_data:
        return 0.0  # weights not loaded: nothing to inspect
    array = numpy_helper.to_array(tensor)
    finite = np.abs(array[np.isfinite(array)])
    return float(finite.max()) if finite.size else 0.0


def _attr_peak(attr: onnx.AttributeProto) -> float:
    if attr.HasField("t"):
        return _peak(attr.t)
    if attr.name in ("value_float", "value_floats"):
        values = [attr.f] if attr.name == "value_float" else list(attr.floats)
        return max((abs(v) for v in values if np.isfinite(v)), default=0.0)
    return 0.0


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in _reads(node):
            users.setdefault(name, []).append(node)
    return users


def _reads(node: onnx.NodeProto) -> set[str]:
    """Names a node reads, including those its subgraphs read from the enclosing scope."""
    names = {n for n in node.input if n}
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else attr.graphs:
            for inner in sub.node:
                names |= _reads(inner)
    return names


def summary(kept: Sequence[KeptNode], op_types: Sequence[str], model: onnx.ModelProto) -> dict[str, Any]:
    """The manifest entry: kept nodes with reasons, and how many nodes the op-type list keeps."""
    listed = set(op_types)
    by_type = sum(1 for g in subgraphs(model.graph) for n in g.node if n.op_type in listed)
    return {"kept_nodes": [k.to_dict() for k in kept], "kept_by_op_type": by_type, "fp32_op_types": list(op_types)}
