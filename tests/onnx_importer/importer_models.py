"""A catalogue of small hand-built ONNX models for the importer tests.

Each builder returns a checked ``onnx.ModelProto`` with fresh random weights drawn from the
given generator. The models imitate what exporters emit for real networks: a conv classifier, a
YOLO-style detection neck and head, a transformer encoder block, and a reshape whose target comes
from ``Shape -> Gather -> Concat`` (the pattern torch.onnx writes for ``x.view(x.size(0), -1)``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class _Graph:
    """Tiny helper to add nodes and random initializers with unique names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def const(self, array: np.ndarray, prefix: str = "c") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, *shape: int, scale: float = 0.2) -> str:
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), "w")

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs: object) -> str | list[str]:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name(op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def model(
        self, inputs: list[onnx.ValueInfoProto], outputs: list[tuple[str, str, int]], opset: int = OPSET
    ) -> onnx.ModelProto:
        # Name the outputs with Identity nodes; their dims are left unknown, only the rank is given.
        outs = []
        for value, name, rank in outputs:
            self.nodes.append(helper.make_node("Identity", [value], [name], name=self.name("out")))
            outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * rank))
        graph = helper.make_graph(self.nodes, "g", inputs, outs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", opset)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def _conv_bn_relu(g: _Graph, x: str, cin: int, cout: int, stride: int = 1) -> str:
    y = g.op("Conv", [x, g.weight(cout, cin, 3, 3)], pads=[1, 1, 1, 1], strides=[stride, stride])
    bn = [
        g.const((1 + 0.1 * g.rng.standard_normal(cout)).astype(np.float32)),
        g.const((0.1 * g.rng.standard_normal(cout)).astype(np.float32)),
        g.const((0.1 * g.rng.standard_normal(cout)).astype(np.float32)),
        g.const((0.5 + g.rng.random(cout)).astype(np.float32)),
    ]
    y = g.op("BatchNormalization", [y, *bn], epsilon=1e-5)
    return str(g.op("Relu", [y]))


def conv_classifier(rng: np.random.Generator, classes: int = 10) -> onnx.ModelProto:
    """conv+bn+relu ×2, max pool, global average pool, flatten, gemm (dynamic batch)."""
    g = _Graph(rng)
    y = _conv_bn_relu(g, "images", 3, 8)
    y = g.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
    y = _conv_bn_relu(g, str(y), 8, 16, stride=2)
    y = g.op("GlobalAveragePool", [y])
    y = g.op("Flatten", [y], axis=1)
    y = g.op("Gemm", [y, g.weight(classes, 16), g.weight(classes)], transB=1)
    inputs = [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, 32, 32])]
    return g.model(inputs, [(str(y), "logits", 2)])


def _silu_conv(g: _Graph, x: str, cin: int, cout: int, k: int = 3, stride: int = 1) -> str:
    y = g.op("Conv", [x, g.weight(cout, cin, k, k), g.weight(cout)], pads=[k // 2] * 4, strides=[stride] * 2)
    return str(g.op("Mul", [y, g.op("Sigmoid", [y])]))


def yolo_head(rng: np.random.Generator, classes: int = 4, reg_max: int = 4) -> onnx.ModelProto:
    """A YOLOv8-style neck and head with dynamic batch, height and width.

    Two strides (8 and 16): the coarse map is upsampled with Resize (nearest, asymmetric, floor,
    scales [1,1,2,2]) and concatenated with the fine one; each level's box/class channels are
    Split (opset-13 ``split`` input), reshaped to ``[batch, C, -1]`` with a target assembled by
    Shape -> Gather -> Unsqueeze -> Concat, concatenated over levels, then a DFL-style Softmax over
    ``reg_max`` bins, a Slice, and a sigmoid on class scores.
    """
    g = _Graph(rng)
    p3 = _silu_conv(g, "images", 3, 8, stride=8)
    p4 = _silu_conv(g, p3, 8, 16, stride=2)
    up = g.op("Resize", [p4, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest",
              coordinate_transformation_mode="asymmetric", nearest_mode="floor")  # fmt: skip
    p3 = _silu_conv(g, str(g.op("Concat", [p3, up], axis=1)), 24, 8)
    shape = g.op("Shape", ["images"])
    batch = g.op("Gather", [shape, g.const(np.array(0, np.int64))], axis=0)
    batch = g.op("Unsqueeze", [batch, g.const(np.array([0], np.int64))])
    levels = []
    channels = 4 * reg_max + classes
    for feat, cin in ((p3, 8), (p4, 16)):
        head = g.op("Conv", [feat, g.weight(channels, cin, 1, 1), g.weight(channels)])
        box, cls = g.op("Split", [head, g.const(np.array([4 * reg_max, classes], np.int64))], n_out=2, axis=1)
        target = g.op("Concat", [batch, g.const(np.array([channels], np.int64)), g.const(np.array([-1], np.int64))],
                      axis=0)  # fmt: skip
        levels.append(g.op("Reshape", [g.op("Concat", [box, cls], axis=1), target]))
    out = g.op("Concat", levels, axis=2)
    box = g.op("Slice", [out, g.const(np.array([0], np.int64)), g.const(np.array([4 * reg_max], np.int64)),
                         g.const(np.array([1], np.int64))])  # fmt: skip
    anchors = g.op("Shape", [box])
    n_anchor = g.op("Gather", [anchors, g.const(np.array([2], np.int64))], axis=0)
    dfl_shape = g.op("Concat", [batch, g.const(np.array([4, reg_max], np.int64)), n_anchor], axis=0)
    dfl = g.op("Softmax", [g.op("Reshape", [box, dfl_shape])], axis=2)
    bins = g.const(np.arange(reg_max, dtype=np.float32).reshape(1, 1, reg_max, 1))
    dist = g.op("ReduceSum", [g.op("Mul", [dfl, bins]), g.const(np.array([2], np.int64))], keepdims=0)
    to_end = g.const(np.array([2**62], np.int64))
    cls = g.op("Slice", [out, g.const(np.array([4 * reg_max], np.int64)), to_end, g.const(np.array([1], np.int64))])
    cls = g.op("Sigmoid", [cls])
    inputs = [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", "width"])]
    return g.model(inputs, [(str(dist), "boxes", 3), (str(cls), "scores", 3)])


def transformer_block(rng: np.random.Generator, dim: int = 16, heads: int = 2, vocab: int = 50) -> onnx.ModelProto:
    """Token embedding (Gather), pre-LN self-attention with a padding mask, GELU MLP.

    Inputs ``tokens`` int64 ``[batch, seq]`` and ``mask`` bool ``[batch, seq]``. The head split
    uses Shape -> Gather -> Concat -> Reshape with dynamic batch and sequence length; the mask
    goes through Unsqueeze, Where (``-inf`` where padded) and Expand; GELU is the Erf form torch
    exports.
    """
    g = _Graph(rng)
    x = g.op("Gather", [g.weight(vocab, dim, scale=1.0), "tokens"], axis=0)
    shape = g.op("Shape", [x])
    b = g.op("Gather", [shape, g.const(np.array([0], np.int64))], axis=0)
    s = g.op("Gather", [shape, g.const(np.array([1], np.int64))], axis=0)
    head_dim = dim // heads
    h = g.op("LayerNormalization", [x, g.const(np.ones(dim, np.float32)), g.const(np.zeros(dim, np.float32))],
             axis=-1, epsilon=1e-5)  # fmt: skip
    split_shape = g.op("Concat", [b, s, g.const(np.array([heads, head_dim], np.int64))], axis=0)
    qkv = []
    for _ in range(3):
        proj = g.op("Add", [g.op("MatMul", [h, g.weight(dim, dim)]), g.weight(dim)])
        qkv.append(g.op("Transpose", [g.op("Reshape", [proj, split_shape])], perm=[0, 2, 1, 3]))
    q, k, v = qkv
    scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = g.op("Div", [scores, g.const(np.array(np.sqrt(head_dim), np.float32))])
    mask = g.op("Unsqueeze", ["mask", g.const(np.array([1, 2], np.int64))])
    full = g.op("Concat", [b, g.const(np.array([heads], np.int64)), s, s], axis=0)
    mask = g.op("Expand", [mask, full])
    scores = g.op("Where", [mask, scores, g.const(np.array(-1e9, np.float32))])
    attn = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    merge_shape = g.op("Concat", [b, s, g.const(np.array([dim], np.int64))], axis=0)
    attn = g.op("Reshape", [g.op("Transpose", [attn], perm=[0, 2, 1, 3]), merge_shape])
    x = g.op("Add", [x, g.op("MatMul", [attn, g.weight(dim, dim)])])
    h = g.op("LayerNormalization", [x, g.const(np.ones(dim, np.float32)), g.const(np.zeros(dim, np.float32))],
             axis=-1, epsilon=1e-5)  # fmt: skip
    h = g.op("Add", [g.op("MatMul", [h, g.weight(dim, 4 * dim)]), g.weight(4 * dim)])
    erf = g.op("Erf", [g.op("Div", [h, g.const(np.array(np.sqrt(2.0), np.float32))])])
    gelu = g.op("Mul", [g.op("Mul", [h, g.op("Add", [erf, g.const(np.array(1.0, np.float32))])]),
                        g.const(np.array(0.5, np.float32))])  # fmt: skip
    x = g.op("Add", [x, g.op("MatMul", [gelu, g.weight(4 * dim, dim)])])
    inputs = [
        helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "seq"]),
    ]
    return g.model(inputs, [(str(x), "hidden", 3)])


def flatten_by_shape(rng: np.random.Generator) -> onnx.ModelProto:
    """``x.view(x.size(0), -1)`` as torch.onnx writes it, then a MatMul (dynamic batch)."""
    g = _Graph(rng)
    shape = g.op("Shape", ["x"])
    batch = g.op("Gather", [shape, g.const(np.array(0, np.int64))], axis=0)
    batch = g.op("Unsqueeze", [batch, g.const(np.array([0], np.int64))])
    target = g.op("Concat", [batch, g.const(np.array([-1], np.int64))], axis=0)
    y = g.op("MatMul", [g.op("Reshape", ["x", target]), g.weight(4 * 5 * 6, 7)])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 5, 6])]
    return g.model(inputs, [(str(y), "y", 2)])


def small_convnet(rng: np.random.Generator) -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Relu -> GAP -> Flatten -> Gemm, for int8 quantisation."""
    g = _Graph(rng)
    y = g.op("Relu", [g.op("Conv", ["images", g.weight(8, 3, 3, 3, scale=0.3), g.weight(8)], pads=[1, 1, 1, 1])])
    y = g.op("Relu", [g.op("Conv", [y, g.weight(16, 8, 3, 3, scale=0.2), g.weight(16)], pads=[1, 1, 1, 1])])
    y = g.op("Flatten", [g.op("GlobalAveragePool", [y])], axis=1)
    y = g.op("Gemm", [y, g.weight(5, 16), g.weight(5)], transB=1)
    inputs = [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, 16, 16])]
    return g.model(inputs, [(str(y), "logits", 2)], opset=13)


def single_op(
    op_type: str,
    inputs: dict[str, np.ndarray],
    n_outputs: int = 1,
    *,
    opset: int = OPSET,
    initializers: dict[str, np.ndarray] | None = None,
    node_inputs: list[str] | None = None,
    dynamic: bool = False,
    **attrs: object,
) -> onnx.ModelProto:
    """A one-node model: ``inputs`` become graph inputs, ``initializers`` constants.

    ``node_inputs`` orders the node's inputs (use ``""`` for an omitted optional input); by
    default the graph inputs then the initializers, in the given order. ``dynamic`` declares
    every input dimension as a named dynamic one (so ONNX Runtime accepts other shapes).
    """
    initializers = initializers or {}
    names = node_inputs if node_inputs is not None else [*inputs, *initializers]
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, name=f"the_{op_type.lower()}", **attrs)
    graph = helper.make_graph(
        [node],
        "single",
        [
            helper.make_tensor_value_info(
                k,
                helper.np_dtype_to_tensor_dtype(v.dtype),
                [f"{k}_{i}" for i in range(v.ndim)] if dynamic else v.shape,
            )
            for k, v in inputs.items()
        ],
        [helper.make_value_info(o, onnx.TypeProto()) for o in outs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def resize_by_computed_sizes(rng: np.random.Generator, factor: float = 1.5) -> onnx.ModelProto:
    """Resize whose ``sizes`` are computed from the input shape (Shape -> Slice -> Cast -> Mul ->
    Floor -> Cast -> Concat), as exporters write ``F.interpolate(x, scale_factor=1.5)`` with
    dynamic H/W."""
    g = _Graph(rng)
    shape = g.op("Shape", ["x"])
    nc = g.op("Slice", [shape, g.const(np.array([0], np.int64)), g.const(np.array([2], np.int64))])
    hw = g.op("Slice", [shape, g.const(np.array([2], np.int64)), g.const(np.array([4], np.int64))])
    hw = g.op("Mul", [g.op("Cast", [hw], to=TensorProto.FLOAT), g.const(np.array([factor], np.float32))])
    hw = g.op("Cast", [g.op("Floor", [hw])], to=TensorProto.INT64)
    sizes = g.op("Concat", [nc, hw], axis=0)
    y = g.op("Resize", ["x", "", "", sizes], mode="linear", coordinate_transformation_mode="half_pixel")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])]
    return g.model(inputs, [(str(y), "y", 4)], opset=13)
