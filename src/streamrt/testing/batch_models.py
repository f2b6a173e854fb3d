"""Small ONNX models for the server's batch-integrity tests (issue 18), with NumPy references.

* :func:`reducing_model`: a ReduceMean without ``axes`` whose graph output claims a dynamic batch
  (``[N, 1, 1, 1]``) but whose value is always ``[1, 1, 1, 1]``: the mean over *every* row. Served
  with dynamic batching and no output check, the first request of a merged batch received a value
  computed from all of them and the others empty arrays.
* :func:`mixed_dtype_model`: three inputs and four outputs of different dtypes (FP32, INT32, FP16 in;
  FP32, INT64, FP16, BOOL out), every output row a function of the same input row only, built from
  elementwise ops and reductions along a row so that ONNX Runtime gives bitwise the same row whatever
  the batch around it (no MatMul: its kernels change with the row count, and so do the last bits).

Example:
    >>> model = mixed_dtype_model()
    >>> x = mixed_dtype_inputs(np.random.default_rng(0), 3)
    >>> sorted(mixed_dtype_reference(x))
    ['flag', 'half', 'rowsum', 'scaled']
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from streamrt.types import ShapeProfile, ShapeRange

__all__ = [
    "MIXED_MAX_BATCH",
    "mixed_dtype_inputs",
    "mixed_dtype_model",
    "mixed_dtype_profiles",
    "mixed_dtype_reference",
    "reducing_model",
    "reducing_profiles",
]

_OPSET = 17
MIXED_MAX_BATCH = 16


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="streamrt")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def reducing_model() -> onnx.ModelProto:
    """``y = ReduceMean(x)`` over all axes, keepdims: declared ``[N, 1, 1, 1]``, always ``[1, 1, 1, 1]``."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"])],
        "reducing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 1, 1])],
    )
    return _finish(graph)


def reducing_profiles(max_batch: int = 8) -> tuple[ShapeProfile, ...]:
    return (ShapeProfile({"x": ShapeRange((1, 3, 4, 4), (max_batch, 3, 4, 4), (max_batch, 3, 4, 4))}),)


def mixed_dtype_model() -> onnx.ModelProto:
    """Inputs a FP32 [N,4], b INT32 [N,3], c FP16 [N,2]; outputs:

    * ``scaled`` FP32 [N,4] = a * 1.5 + sum(b) of the row (as float)
    * ``rowsum`` INT64 [N,1] = sum(b) of the row
    * ``half`` FP16 [N,2] = fp16(float(c) * float(c) - 0.25)
    * ``flag`` BOOL [N,4] = a > 0
    """
    nodes = [
        helper.make_node("Cast", ["b"], ["b64"], to=TensorProto.INT64),
        helper.make_node("ReduceSum", ["b64", "axis1"], ["rowsum"], keepdims=1),
        helper.make_node("Cast", ["rowsum"], ["rowsum_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["a", "one_and_half"], ["a15"]),
        helper.make_node("Add", ["a15", "rowsum_f"], ["scaled"]),
        helper.make_node("Cast", ["c"], ["c32"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["c32", "c32"], ["c2"]),
        helper.make_node("Sub", ["c2", "quarter"], ["c2q"]),
        helper.make_node("Cast", ["c2q"], ["half"], to=TensorProto.FLOAT16),
        helper.make_node("Greater", ["a", "zero"], ["flag"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array(1.5, dtype=np.float32), "one_and_half"),
        numpy_helper.from_array(np.array(0.25, dtype=np.float32), "quarter"),
        numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero"),
    ]
    graph = helper.make_graph(
        nodes,
        "mixed_dtype",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("b", TensorProto.INT32, ["N", 3]),
            helper.make_tensor_value_info("c", TensorProto.FLOAT16, ["N", 2]),
        ],
        [
            helper.make_tensor_value_info("scaled", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("rowsum", TensorProto.INT64, ["N", 1]),
            helper.make_tensor_value_info("half", TensorProto.FLOAT16, ["N", 2]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, ["N", 4]),
        ],
        inits,
    )
    return _finish(graph)


def mixed_dtype_profiles(max_batch: int = MIXED_MAX_BATCH) -> tuple[ShapeProfile, ...]:
    ranges = {name: ShapeRange((1, w), (max(1, max_batch // 2), w), (max_batch, w))
              for name, w in (("a", 4), ("b", 3), ("c", 2))}
    return (ShapeProfile(ranges),)


def mixed_dtype_inputs(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    """Fresh random inputs of ``rows`` rows (integers small enough that no sum overflows)."""
    return {
        "a": rng.standard_normal((rows, 4)).astype(np.float32),
        "b": rng.integers(-1000, 1000, size=(rows, 3), dtype=np.int32),
        "c": rng.standard_normal((rows, 2)).astype(np.float16),
    }


def mixed_dtype_reference(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The outputs in NumPy, with the model's own dtypes and rounding steps (float32 arithmetic)."""
    a, b, c = inputs["a"], inputs["b"], inputs["c"]
    rowsum = b.astype(np.int64).sum(axis=1, keepdims=True)
    c32 = c.astype(np.float32)
    return {
        "scaled": a * np.float32(1.5) + rowsum.astype(np.float32),
        "rowsum": rowsum,
        "half": (c32 * c32 - np.float32(0.25)).astype(np.float16),
        "flag": a > 0,
    }
