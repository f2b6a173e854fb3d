"""Precision transforms: fp16/bf16 casts with fp32-kept ops, int8 Q/DQ from calibration, the cache.

Measured on ORT CPU (2 cores), fresh random data each run, when the bounds were set:

- fp16: max |y16 - y32| is 0.07-0.10 % of max |y32| (bound 0.5 %).
- bf16 (ONNX reference evaluator, which also accumulates in bfloat16): relative L2 error
  0.04-0.08 (bound 0.15).
- int8, 128 calibration samples, 256 fresh evaluation inputs: top-1 agreement 0.90-0.98 with
  fp32 and relative L2 error 0.05-0.07 (min-max), 0.11-0.18 (entropy), 0.05-0.13 (percentile)
  (bounds: agreement >= 0.85, error <= 0.25). The classifier's last layer cancels a large mean
  feature, which makes it harder for int8 than most trained networks.
- int8 calibrated on poor data: tiny-range data gives agreement 0.07-0.14 and error ~0.99;
  constant data gives agreement 0.30-0.52 and error 0.78-0.89 (the test requires error > 0.5 and
  agreement below the good bound).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from streamrt.config import BuildConfig, CalibrationConfig
from streamrt.errors import BuildError, CalibrationError, ConfigError
from streamrt.onnx.precision import FP32_OPS, apply_precision
from streamrt.onnx.runner import onnx_runner

FP16_TOLERANCE = 5e-3  # max |y16 - y32| / max |y32|
BF16_TOLERANCE = 0.15  # ||y_bf16 - y32|| / ||y32||
INT8_MIN_AGREEMENT = 0.85  # top-1 agreement with fp32 on fresh inputs
INT8_MAX_REL_ERROR = 0.25  # ||y8 - y32|| / ||y32||
GOOD_CALIBRATION_BOUNDS = {"minmax": (INT8_MIN_AGREEMENT, INT8_MAX_REL_ERROR),
                           "percentile": (INT8_MIN_AGREEMENT, INT8_MAX_REL_ERROR),
                           "entropy": (0.80, 0.30)}
"""(top-1 agreement, relative error) bounds of int8 with good calibration, by method. Entropy calibration
picks its thresholds from histograms of the 128 fresh samples and varies more from draw to draw: over 160
draws on a 2-core CI-class machine (2026-12-04) its relative error ranged 0.080-0.226 (median 0.131) and its
agreement went down to 0.863, and one CI run drew 0.251 / 0.887, over the shared 0.25 bound; minmax and
percentile stayed at or under 0.138 / at least 0.92 over 40 draws each. Poor calibration (below) gives a
relative error over 0.5, so every bound here still tells the two apart."""
CALIBRATION_SAMPLES = 128


# --- models and data ------------------------------------------------------------------------


def images(n: int, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """Smooth random 3x32x32 "images" with per-image gain and colour shift."""
    low = rng.standard_normal((n, 3, 4, 4)).repeat(8, axis=2).repeat(8, axis=3)
    gain = rng.uniform(0.3, 2.0, (n, 1, 1, 1))
    shift = rng.normal(0.0, 0.5, (n, 3, 1, 1))
    noise = 0.2 * rng.standard_normal((n, 3, 32, 32))
    return (((low + noise) * gain + shift) * scale).astype(np.float32)


def _cnn(rng: np.random.Generator) -> onnx.ModelProto:
    def he(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    inits = {
        "w1": he((16, 3, 3, 3), 27),
        "b1": (0.1 * rng.standard_normal(16)).astype(np.float32),
        "w2": he((32, 16, 3, 3), 144),
        "b2": (0.1 * rng.standard_normal(32)).astype(np.float32),
        "w3": he((10, 32), 32),
        "b3": np.zeros(10, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    """The model's first output, run as the accuracy gate runs references (Q/DQ models unfused:
    ONNX Runtime's fused x86 int8 kernels saturate on CPUs without VNNI, see
    test_int8_cpu_independence.py)."""
    first = model.graph.output[0].name
    return np.asarray(onnx_runner(model)(feed)[first])


def balanced_cnn() -> onnx.ModelProto:
    """Conv-Relu-Conv-Relu-GlobalAveragePool-Gemm, 3x32x32 -> 10 classes, non-degenerate.

    Random classifier rows all point along the (large, positive) mean feature, so every input
    would get the same class; the rows are made orthogonal to the mean feature and scaled so the
    logits spread over the classes.
    """
    rng = np.random.default_rng(7)
    model = _cnn(rng)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.append(helper.make_tensor_value_info("f", TensorProto.FLOAT, ["N", 32]))
    features = run(probe, {"x": images(256, rng)})
    mean = features.mean(axis=0)
    rows = rng.standard_normal((10, 32))
    unit = mean / np.linalg.norm(mean)
    rows -= np.outer(rows @ unit, unit)
    rows *= 3.0 / np.std((features - mean) @ rows.T)
    for init in model.graph.initializer:
        if init.name == "w3":
            init.CopyFrom(numpy_helper.from_array(rows.astype(np.float32), "w3"))
        if init.name == "b3":
            init.CopyFrom(numpy_helper.from_array((-(rows @ mean)).astype(np.float32), "b3"))
    return model


@pytest.fixture(scope="module")
def cnn() -> onnx.ModelProto:
    return balanced_cnn()


def sensitive_model() -> onnx.ModelProto:
    """Mul and MatMul feeding ops that must stay fp32: a 4096-term ReduceSum, LayerNorm, Softmax, Exp."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.uniform(0.9, 1.1, 4096).astype(np.float32), "w")
    proj = numpy_helper.from_array((rng.standard_normal((4096, 16)) * 0.02).astype(np.float32), "proj")
    scale = numpy_helper.from_array(np.ones(16, np.float32), "scale")
    bias = numpy_helper.from_array(np.zeros(16, np.float32), "bias")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["h"], name="mul"),
        helper.make_node("ReduceSum", ["h", "axes"], ["total"], keepdims=1, name="sum"),
        helper.make_node("MatMul", ["h", "proj"], ["p"], name="project"),
        helper.make_node("LayerNormalization", ["p", "scale", "bias"], ["n"], axis=-1, name="norm"),
        helper.make_node("Softmax", ["n"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("Exp", ["n"], ["e"], name="exp"),
    ]
    graph = helper.make_graph(
        nodes,
        "sensitive",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4096])],
        [
            helper.make_tensor_value_info("total", TensorProto.FLOAT, [2, 1]),
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, [2, 16]),
            helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 16]),
        ],
        [w, proj, scale, bias, axes],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.output, *g.value_info)}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def save_samples(folder: Path, batch: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, item in enumerate(batch):
        np.save(folder / f"sample_{i:04d}.npy", item)
    return folder


def int8_config(data: Path, method: str = "minmax", **calib: Any) -> BuildConfig:
    return BuildConfig(precision="int8", calibration=CalibrationConfig(data=data, method=method, **calib))


def accuracy(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, float]:
    agreement = float((reference.argmax(1) == candidate.argmax(1)).mean())
    rel_error = float(np.linalg.norm(candidate - reference) / np.linalg.norm(reference))
    return agreement, rel_error


# --- fp32 / tf32 / fp16 -----------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_fp32_and_tf32_leave_the_model_alone(cnn: onnx.ModelProto, precision: str, tmp_path: Path) -> None:
    assert apply_precision(cnn, BuildConfig(precision=precision), cache_dir=tmp_path) is cnn


@pytest.mark.parametrize("keep_io_types", [True, False])
def test_fp16_cnn_close_to_fp32(cnn: onnx.ModelProto, keep_io_types: bool, tmp_path: Path) -> None:
    before = cnn.SerializeToString()
    messages: list[str] = []
    half = apply_precision(
        cnn, BuildConfig(precision="fp16", keep_io_types=keep_io_types), cache_dir=tmp_path, progress=messages.append
    )
    assert cnn.SerializeToString() == before, "the input model must not be modified"
    assert messages and "fp16" in messages[0]
    io_type = TensorProto.FLOAT if keep_io_types else TensorProto.FLOAT16
    assert half.graph.input[0].type.tensor_type.elem_type == io_type
    assert half.graph.output[0].type.tensor_type.elem_type == io_type
    assert elem_types(half)["w1"] == TensorProto.FLOAT16

    x = images(64, np.random.default_rng())
    reference = run(cnn, {"x": x})
    got = run(half, {"x": x if keep_io_types else x.astype(np.float16)}).astype(np.float32)
    assert np.abs(got - reference).max() <= FP16_TOLERANCE * np.abs(reference).max()


def test_fp16_keeps_sensitive_ops_in_fp32(tmp_path: Path) -> None:
    model = sensitive_model()
    half = apply_precision(model, BuildConfig(precision="fp16"), cache_dir=tmp_path)
    types = elem_types(half)
    nodes = {n.name: n for n in half.graph.node}
    assert types[nodes["mul"].output[0]] == TensorProto.FLOAT16
    assert types[nodes["project"].output[0]] == TensorProto.FLOAT16
    for name in ("sum", "norm", "softmax", "exp"):
        node = nodes[name]
        assert node.op_type in FP32_OPS
        float_inputs = [i for i in node.input if types.get(i) in (TensorProto.FLOAT, TensorProto.FLOAT16)]
        assert all(types[i] == TensorProto.FLOAT for i in float_inputs), name
        assert types[node.output[0]] == TensorProto.FLOAT, name

    # 4096 terms of ~30 sum to ~1.2e5, beyond float16's 65504: only an fp32 ReduceSum gets it right.
    x = np.random.default_rng().uniform(20, 40, (2, 4096)).astype(np.float32)
    reference = run(model, {"x": x})
    total = run(half, {"x": x})
    assert np.all(np.isfinite(total)) and reference.min() > 65504
    np.testing.assert_allclose(total, reference, rtol=2e-3)


def test_fp16_keeps_configured_ops_in_fp32(cnn: onnx.ModelProto, tmp_path: Path) -> None:
    half = apply_precision(cnn, BuildConfig(precision="fp16", fp32_ops=("Relu",)), cache_dir=tmp_path)
    types = elem_types(half)
    relus = [n for n in half.graph.node if n.op_type == "Relu"]
    assert len(relus) == 2
    assert all(types[n.input[0]] == TensorProto.FLOAT and types[n.output[0]] == TensorProto.FLOAT for n in relus)
    convs = [n for n in half.graph.node if n.op_type == "Conv"]
    assert all(types[n.output[0]] == TensorProto.FLOAT16 for n in convs)


# --- bf16 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("keep_io_types", [True, False])
def test_bf16_is_valid_and_close_by_reference_evaluator(
    cnn: onnx.ModelProto, keep_io_types: bool, tmp_path: Path
) -> None:
    """ORT's CPU provider has no bfloat16 Conv/Gemm/Relu kernels, so ONNX's reference evaluator runs it."""
    bf16 = apply_precision(cnn, BuildConfig(precision="bf16", keep_io_types=keep_io_types), cache_dir=tmp_path)
    onnx.checker.check_model(bf16, full_check=True)
    assert max(o.version for o in bf16.opset_import if o.domain == "") >= 22  # Conv takes bfloat16 from 22
    types = elem_types(bf16)
    assert types["w1"] == TensorProto.BFLOAT16
    assert TensorProto.FLOAT16 not in types.values()
    io_type = TensorProto.FLOAT if keep_io_types else TensorProto.BFLOAT16
    assert bf16.graph.input[0].type.tensor_type.elem_type == io_type
    assert bf16.graph.output[0].type.tensor_type.elem_type == io_type

    x = images(8, np.random.default_rng())
    reference = run(cnn, {"x": x})
    feed = x if keep_io_types else x.astype(ml_dtypes.bfloat16)
    got = np.asarray(ReferenceEvaluator(bf16).run(None, {"x": feed})[0]).astype(np.float32)
    assert np.linalg.norm(got - reference) <= BF16_TOLERANCE * np.linalg.norm(reference)


def test_bf16_rounds_weights_from_fp32_without_fp16_clamping(tmp_path: Path) -> None:
    big = np.array([[1.0e5, -3.0e6], [2.5e-9, 1.0]], np.float32)  # outside float16's range
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(big, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    bf16 = apply_precision(model, BuildConfig(precision="bf16"), cache_dir=tmp_path)
    (weight,) = [t for t in bf16.graph.initializer if t.name == "w"]
    stored = np.frombuffer(weight.raw_data, dtype=ml_dtypes.bfloat16).reshape(2, 2)
    np.testing.assert_array_equal(stored, big.astype(ml_dtypes.bfloat16))
    assert weight.doc_string == ""


def test_bf16_refuses_models_that_already_hold_fp16(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(BuildError, match="already holds float16"):
        apply_precision(model, BuildConfig(precision="bf16"), cache_dir=tmp_path)


# --- int8 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
def test_int8_with_good_calibration_stays_within_bound(cnn: onnx.ModelProto, method: str, tmp_path: Path) -> None:
    rng = np.random.default_rng()
    data = save_samples(tmp_path / "calib", images(CALIBRATION_SAMPLES, rng))
    quantized = apply_precision(cnn, int8_config(data, method), cache_dir=tmp_path / "cache")
    ops = [n.op_type for n in quantized.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops

    x = images(256, rng)
    agreement, rel_error = accuracy(run(cnn, {"x": x}), run(quantized, {"x": x}))
    min_agreement, max_rel_error = GOOD_CALIBRATION_BOUNDS[method]
    assert agreement >= min_agreement, (method, agreement, rel_error)
    assert rel_error <= max_rel_error, (method, agreement, rel_error)


@pytest.mark.parametrize(
    "poor",
    [
        pytest.param(lambda rng: images(CALIBRATION_SAMPLES, rng, scale=0.01), id="tiny-range"),
        pytest.param(lambda rng: np.full((CALIBRATION_SAMPLES, 3, 32, 32), 0.5, np.float32), id="constant"),
    ],
)
def test_int8_with_poor_calibration_breaks_the_bound(
    cnn: onnx.ModelProto, poor: Callable[[np.random.Generator], np.ndarray], tmp_path: Path
) -> None:
    rng = np.random.default_rng()
    data = save_samples(tmp_path / "calib", poor(rng))
    quantized = apply_precision(cnn, int8_config(data), cache_dir=tmp_path / "cache")
    x = images(256, rng)
    agreement, rel_error = accuracy(run(cnn, {"x": x}), run(quantized, {"x": x}))
    assert rel_error > 0.5, (agreement, rel_error)
    assert agreement < INT8_MIN_AGREEMENT, (agreement, rel_error)


@pytest.mark.parametrize("per_channel", [True, False])
def test_int8_weight_scales_per_channel(cnn: onnx.ModelProto, per_channel: bool, tmp_path: Path) -> None:
    data = save_samples(tmp_path / "calib", images(8, np.random.default_rng()))
    quantized = apply_precision(cnn, int8_config(data, per_channel=per_channel), cache_dir=tmp_path)
    scales = {t.name: numpy_helper.to_array(t) for t in quantized.graph.initializer if t.name.endswith("_scale")}
    conv_scale = scales["w1_scale"]
    assert conv_scale.shape == ((16,) if per_channel else ())
    activation = [n for n in quantized.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x"]
    assert activation, "the Conv input must be quantized"
    zero_point = next(t for t in quantized.graph.initializer if t.name == activation[0].input[2])
    assert zero_point.data_type == TensorProto.INT8 and numpy_helper.to_array(zero_point) == 0  # symmetric


class CalibratorSpy:
    """Counts ORT calibrator creations: zero means the build reused cached ranges."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from onnxruntime.quantization import calibrate

        self.calls = 0
        real = calibrate.create_calibrator

        def counting(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(calibrate, "create_calibrator", counting)


def test_int8_second_build_reuses_the_calibration_cache(
    cnn: onnx.ModelProto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spy = CalibratorSpy(monkeypatch)
    data = save_samples(tmp_path / "calib", images(16, np.random.default_rng()))
    config = int8_config(data)
    first = apply_precision(cnn, config, cache_dir=tmp_path / "cache")
    assert spy.calls == 1
    (cache_file,) = (tmp_path / "cache" / "calibration").glob("*.json")
    content = json.loads(cache_file.read_text())
    assert content["key"]["digest"] == cache_file.stem and "x" in content["ranges"]["data"]
    assert cache_file.with_name(f"{cache_file.stem}.trt.flatbuffers").is_file()

    lines: list[str] = []
    with caplog.at_level(logging.INFO, logger="streamrt"):
        second = apply_precision(cnn, config, cache_dir=tmp_path / "cache", progress=lines.append)
    assert spy.calls == 1, "the second build must not calibrate again"
    # Said once, on the progress channel the CLI shows (issue 20 item 8: it was also logged at INFO).
    assert sum("reusing calibration cache" in line for line in lines) == 1
    assert "reusing calibration cache" not in caplog.text
    assert second.SerializeToString() == first.SerializeToString()

    np.save(data / "sample_0000.npy", images(1, np.random.default_rng())[0])  # new data, new key
    apply_precision(cnn, config, cache_dir=tmp_path / "cache")
    assert spy.calls == 2
    assert len(list((tmp_path / "cache" / "calibration").glob("*.json"))) == 2


def test_int8_explicit_cache_works_without_the_data_folder(
    cnn: onnx.ModelProto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = CalibratorSpy(monkeypatch)
    data = save_samples(tmp_path / "calib", images(16, np.random.default_rng()))
    config = int8_config(data, cache=tmp_path / "ranges.json")
    first = apply_precision(cnn, config, cache_dir=tmp_path / "cache")
    assert (tmp_path / "ranges.json").is_file() and not (tmp_path / "cache").exists()

    shutil.rmtree(data)
    second = apply_precision(cnn, config, cache_dir=tmp_path / "cache")
    assert spy.calls == 1
    assert second.SerializeToString() == first.SerializeToString()

    other = int8_config(data, method="percentile", cache=tmp_path / "ranges.json")
    with pytest.raises(CalibrationError, match="calibration folder not found"):
        apply_precision(cnn, other, cache_dir=tmp_path / "cache")


def test_int8_failure_leaves_no_files(cnn: onnx.ModelProto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    data = tmp_path / "calib"
    save_samples(data, images(4, np.random.default_rng()))
    np.save(data / "sample_0003.npy", np.ones((3, 16, 16), np.float32))  # the last sample is wrong
    with pytest.raises(CalibrationError, match=r"sample_0003\.npy: input 'x' expects shape"):
        apply_precision(cnn, int8_config(data), cache_dir=tmp_path / "cache")
    assert list(scratch.iterdir()) == []
    assert not (tmp_path / "cache").exists()


def test_int8_errors(cnn: onnx.ModelProto, tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="calibration folder not found"):
        apply_precision(cnn, int8_config(tmp_path / "missing"), cache_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CalibrationError, match="holds no samples"):
        apply_precision(cnn, int8_config(tmp_path / "empty"), cache_dir=tmp_path)
    everything = ("Conv", "ConvTranspose", "Gemm", "MatMul")
    config = int8_config(tmp_path / "empty").replace(fp32_ops=everything)
    with pytest.raises(ConfigError, match="excludes every int8 op type"):
        apply_precision(cnn, config, cache_dir=tmp_path)
