"""A catalogue of small ONNX models with NumPy references, shared by every backend's tests.

Each :class:`CatalogueModel` builds an ONNX model with deterministic random weights, makes
fresh random inputs, and computes the expected outputs in float64 NumPy. Backends join by
running ``for m in CATALOGUE: check(m)``; a new backend adds no new models.

``resnet_like`` builds a ResNet-18-shaped classifier of realistic size (11 M parameters at
224x224) for benchmarks and int8 calibration studies without downloading weights.

Run ``python -m streamrt.testing.models NAME OUT.onnx`` to write one to disk.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from streamrt.errors import describe_os_error
from streamrt.types import ShapeProfile, ShapeRange

__all__ = ["CATALOGUE", "CatalogueModel", "resnet_like", "small_cnn"]

OPSET = 17
Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class CatalogueModel:
    """A model, how to feed it, and what it must return.

    Attributes:
        name: catalogue key.
        make: builds the ONNX model (deterministic weights).
        inputs: makes fresh random inputs for a batch size from a generator.
        reference: float64 NumPy reference; takes the model (for its weights) and inputs.
        profiles: profiles to build with ((): static model).
        rtol / atol: fp32 tolerance for a backend's output against the reference.
    """

    name: str
    make: Callable[[], onnx.ModelProto]
    inputs: Callable[[np.random.Generator, int], Arrays]
    reference: Callable[[onnx.ModelProto, Arrays], Arrays]
    profiles: tuple[ShapeProfile, ...] = ()
    rtol: float = 1e-4
    atol: float = 1e-4


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: dict[str, np.ndarray],
    name: str,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        inputs,
        outputs,
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="streamrt")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _f32(name: str, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _he(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    fan_in = int(np.prod(shape[1:]))
    return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)


def _batch_profile(name: str, rest: tuple[int, ...], opt: int = 4, hi: int = 16) -> tuple[ShapeProfile, ...]:
    return (ShapeProfile({name: ShapeRange((1, *rest), (opt, *rest), (hi, *rest))}),)


# --- NumPy reference ops (float64) ------------------------------------------------------------


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int = 1, pad: int = 0) -> np.ndarray:
    """NCHW convolution via im2col."""
    h, wd = x.shape[2:]
    k, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    cols = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    out = np.einsum("nchwij,kcij->nkhw", cols[:, :, :oh, :ow], w, optimize=True)
    return out + (b.reshape(1, k, 1, 1) if b is not None else 0)


def maxpool2(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return x[:, :, : h // 2 * 2, : w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# --- the catalogue ----------------------------------------------------------------------------


def _elementwise() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["a"]),
        helper.make_node("Add", ["a", "one"], ["b"]),
        helper.make_node("Relu", ["b"], ["c"]),
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Sub", ["c", "s"], ["y"]),
    ]
    inits = {"two": np.array(2.0), "one": np.array(1.0)}
    return _model(nodes, [_f32("x", ["N", 8])], [_f32("y", ["N", 8])], inits, "elementwise")


def _elementwise_ref(m: onnx.ModelProto, i: Arrays) -> Arrays:
    x = i["x"].astype(np.float64)
    return {"y": relu(2 * x + 1) - 1 / (1 + np.exp(-x))}


def _matmul() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    inits = {"w": rng.standard_normal((32, 16)) / 4, "b": rng.standard_normal(16)}
    return _model(nodes, [_f32("x", ["N", 32])], [_f32("y", ["N", 16])], inits, "matmul")


def _matmul_ref(m: onnx.ModelProto, i: Arrays) -> Arrays:
    w = _weights(m)
    return {"y": i["x"].astype(np.float64) @ w["w"] + w["b"]}


def _conv_bn_relu() -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "beta", "mu", "var"], ["n"], epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    inits = {
        "w": _he(rng, (8, 3, 3, 3)),
        "b": rng.standard_normal(8) * 0.1,
        "g": rng.uniform(0.5, 1.5, 8),
        "beta": rng.standard_normal(8) * 0.1,
        "mu": rng.standard_normal(8) * 0.1,
        "var": rng.uniform(0.5, 2, 8),
    }
    return _model(nodes, [_f32("x", [1, 3, 16, 16])], [_f32("y", [1, 8, 16, 16])], inits, "conv_bn_relu")


def _conv_bn_relu_ref(m: onnx.ModelProto, i: Arrays) -> Arrays:
    w = _weights(m)
    c = conv2d(i["x"].astype(np.float64), w["w"], w["b"], pad=1)
    shape = (1, -1, 1, 1)
    n = (c - w["mu"].reshape(shape)) / np.sqrt(w["var"].reshape(shape) + 1e-5) * w["g"].reshape(shape) + w[
        "beta"
    ].reshape(shape)
    return {"y": relu(n)}


def _dynamic_batch() -> onnx.ModelProto:
    """Flatten through Shape -> Gather -> Concat -> Reshape, as exporters write it."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["new_shape"], axis=0),
        helper.make_node("Reshape", ["x", "new_shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dynamic_batch",
        [_f32("x", ["N", 4, 6])],
        [_f32("y", ["N", 5])],
        [
            numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
            numpy_helper.from_array(np.array([0], dtype=np.int64), "axes0"),
            numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus_one"),
            numpy_helper.from_array((rng.standard_normal((24, 5)) / 5).astype(np.float32), "w"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="streamrt")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _dynamic_batch_ref(m: onnx.ModelProto, i: Arrays) -> Arrays:
    x = i["x"].astype(np.float64)
    return {"y": x.reshape(x.shape[0], -1) @ _weights(m)["w"]}


def _two_io() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Mul", ["a", "b"], ["prod"]),
        helper.make_node("Softmax", ["prod"], ["probs"], axis=-1),
    ]
    return _model(
        nodes,
        [_f32("a", ["N", 10]), _f32("b", ["N", 10])],
        [_f32("sum", ["N", 10]), _f32("probs", ["N", 10])],
        {},
        "two_io",
    )


def _two_io_ref(m: onnx.ModelProto, i: Arrays) -> Arrays:
    a, b = i["a"].astype(np.float64), i["b"].astype(np.float64)
    return {"sum": a + b, "probs": softmax(a * b)}


def small_cnn(classes: int = 10, size: int = 32, seed: int = 4) -> onnx.ModelProto:
    """Conv-Relu-MaxPool-Conv-Relu-GlobalAveragePool-Flatten-Gemm classifier, dynamic batch."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
    ]
    inits = {
        "w1": _he(rng, (16, 3, 3, 3)),
        "b1": rng.standard_normal(16) * 0.1,
        "w2": _he(rng, (32, 16, 3, 3)),
        "b2": rng.standard_normal(32) * 0.1,
        "wf": rng.standard_normal((classes, 32)) * 0.5,
        "bf": rng.standard_normal(classes) * 0.1,
    }
    return _model(
        nodes, [_f32("x", ["N", 3, size, size])], [_f32("logits", ["N", classes])], inits, "small_cnn"
    )


def _small_cnn_ref(m: onnx.ModelProto, i: Arrays) -> Arrays:
    w = _weights(m)
    r1 = relu(conv2d(i["x"].astype(np.float64), w["w1"], w["b1"], pad=1))
    r2 = relu(conv2d(maxpool2(r1), w["w2"], w["b2"], pad=1))
    return {"logits": r2.mean(axis=(2, 3)) @ w["wf"].T + w["bf"]}


CATALOGUE: dict[str, CatalogueModel] = {
    m.name: m
    for m in (
        CatalogueModel(
            "elementwise",
            _elementwise,
            lambda r, n: {"x": _rand(r, n, 8)},
            _elementwise_ref,
            _batch_profile("x", (8,)),
        ),
        CatalogueModel(
            "matmul", _matmul, lambda r, n: {"x": _rand(r, n, 32)}, _matmul_ref, _batch_profile("x", (32,))
        ),
        CatalogueModel(
            "conv_bn_relu", _conv_bn_relu, lambda r, n: {"x": _rand(r, 1, 3, 16, 16)}, _conv_bn_relu_ref
        ),
        CatalogueModel(
            "dynamic_batch",
            _dynamic_batch,
            lambda r, n: {"x": _rand(r, n, 4, 6)},
            _dynamic_batch_ref,
            _batch_profile("x", (4, 6)),
        ),
        CatalogueModel(
            "two_io",
            _two_io,
            lambda r, n: {"a": _rand(r, n, 10), "b": _rand(r, n, 10)},
            _two_io_ref,
            (
                ShapeProfile(
                    {"a": ShapeRange((1, 10), (4, 10), (16, 10)), "b": ShapeRange((1, 10), (4, 10), (16, 10))}
                ),
            ),
        ),
        CatalogueModel(
            "small_cnn",
            small_cnn,
            lambda r, n: {"x": _rand(r, n, 3, 32, 32)},
            _small_cnn_ref,
            _batch_profile("x", (3, 32, 32)),
            rtol=1e-3,
            atol=1e-3,
        ),
    )
}


def _bn_fold(rng: np.random.Generator, cin: int, cout: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """He-initialised conv weights with a folded batch-norm scale, as a trained model would ship."""
    return _he(rng, (cout, cin, k, k)) * 0.7, rng.standard_normal(cout) * 0.05


def resnet_like(depth: int = 18, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """A ResNet-18/34-shaped classifier (BN folded into conv, as exporters do), dynamic batch, 3x224x224."""
    blocks = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}[depth]
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: dict[str, np.ndarray] = {}
    counter = iter(range(10_000))

    def conv(x: str, cin: int, cout: int, k: int, stride: int, act: bool) -> str:
        i = next(counter)
        w, b = _bn_fold(rng, cin, cout, k)
        inits[f"conv{i}.w"], inits[f"conv{i}.b"] = w, b
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"conv{i}.w", f"conv{i}.b"],
                [f"conv{i}"],
                pads=[k // 2] * 4,
                strides=[stride, stride],
            )
        )
        if not act:
            return f"conv{i}"
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"]))
        return f"relu{i}"

    x = conv("images", 3, 64, 7, 2, True)
    nodes.append(
        helper.make_node("MaxPool", [x], ["pool0"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    )
    x, cin = "pool0", 64
    for stage, count in enumerate(blocks):
        cout = 64 * 2**stage
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            y = conv(conv(x, cin, cout, 3, stride, True), cout, cout, 3, 1, False)
            skip = conv(x, cin, cout, 1, stride, False) if stride != 1 or cin != cout else x
            i = next(counter)
            nodes.append(helper.make_node("Add", [y, skip], [f"add{i}"]))
            nodes.append(helper.make_node("Relu", [f"add{i}"], [f"out{i}"]))
            x, cin = f"out{i}", cout
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["feat"], axis=1),
        helper.make_node("Gemm", ["feat", "fc.w", "fc.b"], ["logits"], transB=1),
    ]
    inits["fc.w"] = rng.standard_normal((classes, cin)) * np.sqrt(1.0 / cin)
    inits["fc.b"] = np.zeros(classes)
    return _model(
        nodes,
        [_f32("images", ["N", 3, 224, 224])],
        [_f32("logits", ["N", classes])],
        inits,
        f"resnet{depth}_like",
    )


_WRITERS: dict[str, Callable[[], onnx.ModelProto]] = {
    **{name: m.make for name, m in CATALOGUE.items()},
    "resnet18": lambda: resnet_like(18),
    "resnet34": lambda: resnet_like(34),
}

def main(argv: list[str] | None = None) -> int:
    """``python -m streamrt.testing.models NAME OUT.onnx``: write one catalogue model (status 2 on errors).

    A path that cannot be written is one line (``error: cannot write ...: read-only file system``),
    not an OSError traceback; missing folders are created, as ``streamrt build -o`` does.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in _WRITERS:
        sys.stderr.write(f"usage: python -m streamrt.testing.models {{{','.join(_WRITERS)}}} OUT.onnx\n")
        return 2
    name, out = args[0], Path(args[1])
    written = _WRITERS[name]()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(written, str(out))
    except OSError as exc:
        sys.stderr.write(f"python -m streamrt.testing.models: error: cannot write {describe_os_error(exc)} "
                         "(hint: give a path in a folder you can write to)\n")
        return 2
    size = out.stat().st_size
    print(f"wrote {out}: {name}, {len(written.graph.node)} nodes, {size / 1024:.1f} KiB")
    return 0


if __name__ == "__main__":
    status = main()
    if status:
        raise SystemExit(status)
