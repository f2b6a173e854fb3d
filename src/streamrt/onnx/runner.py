"""Run an ONNX model with ONNX Runtime on the CPU: the fp32 reference of accuracy checks.

The accuracy gate (:mod:`streamrt.building.accuracy_gate`), int8's sensitivity pass and the fp16 range
check all compare against the model run here, so one place decides how a reference runs: the CPU
provider, quiet logs, and float inputs cast to the dtype each model input expects (an fp16 model
built without kept I/O types takes the same feeds as its fp32 original).

A model with Q/DQ nodes runs *as written* (basic graph optimizations only): each
``DequantizeLinear`` then feeds a float op, which is exactly the integer arithmetic TensorRT (or
any non-saturating int8 kernel) computes, on every CPU. With ONNX Runtime's extended optimizations
a ``DQ -> Gemm`` pair becomes a ``QGemm`` whose x86 kernel, on CPUs without VNNI, multiplies
byte pairs with ``VPMADDUBSW`` and saturates their int16 sum: the test suite's int8 CNN kept
0.96 top-1 agreement with fp32 on an AVX-512 VNNI machine and 0.75-0.78 on an AVX2-only one.
An accuracy figure that depends on the CPU it was measured on judges nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from streamrt.onnx.model import OnnxModel, tensor_specs

__all__ = ["Runner", "has_qdq", "onnx_runner", "reference_options"]

_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})

Runner = Callable[[Mapping[str, np.ndarray]], dict[str, Any]]
"""Runs one feed and returns arrays by output name."""


def has_qdq(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s main graph holds quantize/dequantize nodes (an explicitly quantized model)."""
    return any(node.op_type in _QDQ_OPS for node in model.graph.node)


def reference_options(proto: onnx.ModelProto, *, threads: int = 0) -> Any:
    """ONNX Runtime session options for a reference run of ``proto`` (see the module docs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    if has_qdq(proto):
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return options


def onnx_runner(model: str | Path | onnx.ModelProto | OnnxModel, *, threads: int = 0) -> Runner:
    """A function that runs ``model`` on one feed with ONNX Runtime's CPU provider.

    Args:
        model: an ONNX file, a proto or a loaded :class:`OnnxModel` (below 2 GB).
        threads: intra-op threads (0: ONNX Runtime's default).
    """
    import onnxruntime as ort

    proto = model.proto if isinstance(model, OnnxModel) else model
    if isinstance(proto, str | Path):
        proto = onnx.load(str(proto))
    options = reference_options(proto, threads=threads)
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {spec.name: spec.dtype.numpy for spec in tensor_specs(proto, "input")}
    names = [o.name for o in session.get_outputs()]

    def run(feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        cast = {}
        for name, array in feeds.items():
            value = np.asarray(array)
            dtype = wanted.get(name)
            is_float = value.dtype.kind == "f" or value.dtype.name == "bfloat16"
            cast[name] = value.astype(dtype) if dtype is not None and is_float and value.dtype != dtype else value
        return dict(zip(names, session.run(names, cast), strict=True))

    return run
