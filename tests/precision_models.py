"""ONNX models built in the tests for the precision work (issue 11): each reproduces a real failure."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["bn_model", "overflow_chain", "seq_model", "tiny_scale"]


def bn_model(rng: np.random.Generator, *, through_reshape: bool = False) -> onnx.ModelProto:
    """Conv -> BatchNormalization (variances 1e3..1e8 from a Constant node) -> Relu."""
    c = 8
    w = (rng.standard_normal((c, 3, 3, 3)) * 800).astype(np.float32)
    var = np.logspace(3, 8, c).astype(np.float32)
    rng.shuffle(var)
    mean = rng.normal(0, 50, c).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, c).astype(np.float32)
    bias = rng.normal(0, 0.1, c).astype(np.float32)
    var_name = "var_flat" if through_reshape else "var"
    const_value = var.reshape(1, c) if through_reshape else var
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Constant", [], [var_name], value=numpy_helper.from_array(const_value, "v")),
    ]
    if through_reshape:
        nodes.append(helper.make_node("Reshape", [var_name, "shape"], ["var"]))
    nodes += [
        helper.make_node("BatchNormalization", ["conv", "scale", "bias", "mean", "var"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["y"], name="relu"),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (scale, "scale"), (bias, "bias"), (mean, "mean"))]
    inits.append(numpy_helper.from_array(np.array([c], np.int64), "shape"))
    graph = helper.make_graph(
        nodes,
        "bn_overflow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 16, 16])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def tiny_scale() -> onnx.ModelProto:
    """y = x * 1e-9: the scale is below fp16's smallest subnormal (the converter clamps it to 6e-8)."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"], name="scale")],
        "tiny_scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [numpy_helper.from_array(np.array(1e-9, np.float32), "k")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def overflow_chain() -> onnx.ModelProto:
    """y = (x * 1000)^2 * 1e-6: every constant fits fp16, the middle activation (~1e6) does not."""
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("k1", 1e3), ("k3", 1e-6))]
    nodes = [
        helper.make_node("Mul", ["x", "k1"], ["a"], name="mul1"),
        helper.make_node("Mul", ["a", "a"], ["b"], name="mul2"),
        helper.make_node("Mul", ["b", "k3"], ["y"], name="mul3"),
    ]
    graph = helper.make_graph(
        nodes,
        "overflow_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def seq_model(
    rng: np.random.Generator, *, vocab: int = 64, d: int = 32, classes: int = 12, outlier: float = 40.0, opset: int = 12
) -> onnx.ModelProto:
    """Token ids (B x T) -> embedding -> 1 self-attention block with decomposed LayerNorm -> B x T x C."""

    def w(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[0])).astype(np.float32)

    emb = rng.standard_normal((vocab, d)).astype(np.float32)
    emb[:, :2] *= outlier  # outlier feature channels, as trained transformers have
    inits = {
        "emb": emb,
        "wq": w(d, d),
        "wk": w(d, d),
        "wv": w(d, d),
        "wo": w(d, d),
        "w1": w(d, 4 * d),
        "w2": w(4 * d, d),
        "wc": w(d, classes),
        "g1": np.ones(d, np.float32),
        "b1": np.zeros(d, np.float32),
        "eps": np.array(1e-5, np.float32),
        "two": np.array(2.0, np.float32),
        "scale": np.array(1 / np.sqrt(d), np.float32),
    }
    N = helper.make_node

    def ln(x: str, out: str) -> list[onnx.NodeProto]:
        return [
            N("ReduceMean", [x], [f"{out}_mu"], axes=[-1]),
            N("Sub", [x, f"{out}_mu"], [f"{out}_c"]),
            N("Pow", [f"{out}_c", "two"], [f"{out}_sq"]),
            N("ReduceMean", [f"{out}_sq"], [f"{out}_var"], axes=[-1]),
            N("Add", [f"{out}_var", "eps"], [f"{out}_ve"]),
            N("Sqrt", [f"{out}_ve"], [f"{out}_sd"]),
            N("Div", [f"{out}_c", f"{out}_sd"], [f"{out}_n"]),
            N("Mul", [f"{out}_n", "g1"], [f"{out}_g"]),
            N("Add", [f"{out}_g", "b1"], [out]),
        ]

    nodes = [
        N("Gather", ["emb", "tokens"], ["x"]),
        N("MatMul", ["x", "wq"], ["q"]),
        N("MatMul", ["x", "wk"], ["k"]),
        N("MatMul", ["x", "wv"], ["v"]),
        N("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        N("MatMul", ["q", "kt"], ["s0"]),
        N("Mul", ["s0", "scale"], ["s"]),
        N("Softmax", ["s"], ["p"], axis=-1),
        N("MatMul", ["p", "v"], ["a"]),
        N("MatMul", ["a", "wo"], ["o"]),
        N("Add", ["x", "o"], ["r1"]),
        *ln("r1", "h1"),
        N("MatMul", ["h1", "w1"], ["f1"]),
        N("Relu", ["f1"], ["f2"]),
        N("MatMul", ["f2", "w2"], ["f3"]),
        N("Add", ["h1", "f3"], ["r2"]),
        N("MatMul", ["r2", "wc"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "seq",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["B", 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 16, classes])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
