"""int8 that finds what it must not quantize: opset upgrade, reported pre-processing, sensitivity pass.

The regression case of issue 11: a transformer-style per-step classifier (embedding, attention
with Softmax, LayerNorm decomposed as opset-12 exports have it, B x T x C output) with outlier
feature channels, as trained transformers have. Plain int8 agrees with fp32 on 92-95 % of steps
(measured on fresh token sequences); the sensitivity pass, searching for 99.5 % on the 16 x 4
calibration sequences (headroom for unseen ones), keeps 6 of the 9 MatMuls in fp32 with this
calibration data and reaches 99.3-99.7 % on fresh sequences (bound: 99 %). The outlier channels
reach every layer through the residual stream, so most layers matter here; the count is reported,
not assumed. Runs in ~15 s on 2 loaded cores.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest

from precision_models import seq_model
from streamrt.building.accuracy_gate import measure_accuracy
from streamrt.config import BuildConfig, CalibrationConfig
from streamrt.onnx.precision import lower_precision

TARGET_TOP1 = 0.99  # the bar: per-step top-1 agreement with fp32, on fresh sequences
SEARCH_TOP1 = 0.995  # the pass's target on the calibration samples: headroom for unseen data


@pytest.fixture
def calib(tmp_path: Path) -> Path:
    folder = tmp_path / "calib"
    folder.mkdir()
    rng = np.random.default_rng(2)  # fixed, like the model: the pass's choice is then deterministic
    for i in range(16):
        np.savez(folder / f"{i:03d}.npz", tokens=rng.integers(0, 64, (4, 16)))
    return folder


def fresh_tokens(n: int = 32) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng()
    return [{"tokens": rng.integers(0, 64, (4, 16))} for _ in range(n)]


def test_sensitivity_pass_restores_per_step_agreement(tmp_path: Path, calib: Path) -> None:
    model = seq_model(np.random.default_rng(0))
    calibration = CalibrationConfig(calib, method="minmax")
    plain = lower_precision(model, BuildConfig(precision="int8", calibration=calibration), cache_dir=tmp_path)
    config = BuildConfig(precision="int8", calibration=calibration, int8_target=f"top1={SEARCH_TOP1}")
    lines: list[str] = []
    guarded = lower_precision(model, config, cache_dir=tmp_path, progress=lines.append)
    # 128 fresh sequences, not 32: with 32 the guarded plan's agreement spreads 0.988-0.997 over 400 draws
    # (3 below the bound; a CI run failed so on 2026-12-03); with 128 the lowest of 40 draws was 0.9928
    feeds = fresh_tokens(128)
    before = measure_accuracy(model, plain.model, feeds).output("logits").top1
    after = measure_accuracy(model, guarded.model, feeds).output("logits").top1
    assert before is not None and after is not None
    assert before < TARGET_TOP1, f"plain int8 should lose accuracy on this model, got top1 {before}"
    assert after >= TARGET_TOP1, (before, after, guarded.summary)
    record = guarded.record["sensitivity"]
    assert record["met"] and 0 < len(record["kept_layers"]) < record["candidates"]
    assert all(k["op_type"] == "MatMul" for k in record["kept_layers"])
    assert guarded.summary.startswith(f"int8: target top1={SEARCH_TOP1:g} met: kept")
    assert len(guarded.details) == len(record["kept_layers"])
    assert any("measuring" in line for line in lines)
    quantized = {n.name for n in guarded.model.graph.node if n.op_type == "DequantizeLinear"}
    assert quantized, "the pass must keep most of the model in int8"


def test_opset_is_upgraded_for_per_channel_qdq(tmp_path: Path, calib: Path) -> None:
    model = seq_model(np.random.default_rng(0), opset=12)
    config = BuildConfig(precision="int8", calibration=CalibrationConfig(calib, method="minmax"))
    result = lower_precision(model, config, cache_dir=tmp_path)
    assert result.record["opset"] == 13 and result.record["per_channel"]
    onnx.checker.check_model(result.model, full_check=True)
    axes = [
        a for n in result.model.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute if a.name == "axis"
    ]
    assert axes, "per-channel weights carry an axis (opset >= 13)"


def test_preprocessing_failure_is_reported_with_its_reason(
    tmp_path: Path, calib: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Symbolic shape inference asserting (as on the OCR models) is retried without it and reported."""
    from onnxruntime.tools import symbolic_shape_infer

    def broken(*args: object, **kwargs: object) -> None:
        raise AssertionError("Concat: incompatible symbolic dims")

    monkeypatch.setattr(symbolic_shape_infer.SymbolicShapeInference, "infer_shapes", staticmethod(broken))
    config = BuildConfig(precision="int8", calibration=CalibrationConfig(calib, method="minmax"))
    with caplog.at_level(logging.WARNING):
        result = lower_precision(seq_model(np.random.default_rng(0)), config, cache_dir=tmp_path)
    note = next(n for n in result.record["notes"] if "pre-processing" in n)
    assert "AssertionError: Concat: incompatible symbolic dims" in note and "retried without it" in note
    assert "as is" not in caplog.text and "Concat: incompatible" in caplog.text


def _conv_with_constant_bias(rng: np.random.Generator) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    bias = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [
        helper.make_node("Constant", [], ["bias"], value=bias),
        helper.make_node("Conv", ["x", "w", "bias"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_constant_bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_failed_preprocessing_still_quantizes_constant_biases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Pre-processing failing outright is reported; biases held by Constants are still quantized,
    and ORT's per-bias "Expected bias ... to be an initializer" lines never reach the log."""
    from onnxruntime.quantization import shape_inference

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Incomplete symbolic shape inference")

    monkeypatch.setattr(shape_inference, "quant_pre_process", broken)
    rng = np.random.default_rng()
    folder = tmp_path / "calib"
    folder.mkdir()
    for i in range(4):
        np.save(folder / f"{i}.npy", rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
    config = BuildConfig(precision="int8", calibration=CalibrationConfig(folder))
    with caplog.at_level(logging.WARNING):
        result = lower_precision(_conv_with_constant_bias(rng), config, cache_dir=tmp_path)
    assert any(
        "pre-processing failed" in n and "Incomplete symbolic shape inference" in n for n in result.record["notes"]
    )
    assert "Expected bias" not in caplog.text and not any("bias input" in n for n in result.record["notes"])
    biases = [n for n in result.model.graph.node if n.op_type == "DequantizeLinear" and "bias" in n.input[0]]
    assert biases, "the Constant bias is quantized (int32 + DequantizeLinear)"
