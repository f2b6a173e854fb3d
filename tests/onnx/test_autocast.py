"""fp16/bf16 that protects itself: values that overflow the low-precision type keep their nodes fp32.

The regression case of issue 11: a BatchNormalization whose running variances (1e3..1e8) arrive
through a ``Constant`` node. Before the range rules the fp16 conversion clamped them to 65504
(cosine 0.975 on this model, 0.43 on the text detector); now the Constant and the BN stay fp32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from precision_models import bn_model
from streamrt.building.accuracy_gate import measure_accuracy
from streamrt.config import BuildConfig
from streamrt.onnx.autocast import DATA_MAX, large_activations, name_nodes, overflowing_constants
from streamrt.onnx.precision import lower_precision

MIN_COSINE = 0.999  # the bar for fp16 on a model with fp16-overflowing BN statistics


def feeds(rng: np.random.Generator, n: int = 4) -> list[dict[str, np.ndarray]]:
    return [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(n)]


def test_fp16_keeps_bn_with_overflowing_constant_statistics(tmp_path: Path) -> None:
    rng = np.random.default_rng()
    model = bn_model(rng)
    result = lower_precision(model, BuildConfig(precision="fp16"), cache_dir=tmp_path)
    report = measure_accuracy(model, result.model, feeds(rng))
    assert report.output("y").cosine >= MIN_COSINE, report.lines()
    kept = {k["op_type"] for k in result.record["kept_nodes"]}
    assert kept == {"Constant", "BatchNormalization"}, result.record
    assert "1 overflowing" not in result.summary and "2 node(s) kept in fp32" in result.summary
    assert any("1e+08" in line or "> 65504" in line for line in result.details)


def test_overflow_is_followed_through_data_movement_ops(tmp_path: Path) -> None:
    model = bn_model(np.random.default_rng(), through_reshape=True)
    name_nodes(model.graph)
    kept = {k.op_type for k in overflowing_constants(model, 65504.0)}
    assert kept == {"Constant", "Reshape", "BatchNormalization"}
    rng = np.random.default_rng()
    half = lower_precision(model, BuildConfig(precision="fp16"), cache_dir=tmp_path).model
    assert measure_accuracy(model, half, feeds(rng)).output("y").cosine >= MIN_COSINE


def test_bf16_does_not_keep_values_bfloat16_can_hold(tmp_path: Path) -> None:
    model = bn_model(np.random.default_rng())
    result = lower_precision(model, BuildConfig(precision="bf16"), cache_dir=tmp_path)
    assert result.record["kept_nodes"] == []  # 1e8 is far below bfloat16's 3.4e38


def test_large_activations_on_sample_data_keep_their_nodes() -> None:
    """The conv outputs reach ~1e4 (weights x800): above DATA_MAX, so conv, bn and relu are kept."""
    rng = np.random.default_rng()
    model = bn_model(rng)
    name_nodes(model.graph)
    kept = {k.name: k.reason for k in large_activations(model, feeds(rng, 2), DATA_MAX)}
    assert {"conv", "bn"} <= set(kept), kept
    assert "sample data" in kept["conv"]
    small = [{"x": (f["x"] * 1e-4).astype(np.float32)} for f in feeds(rng, 2)]
    assert "conv" not in {k.name for k in large_activations(model, small, DATA_MAX)}


def test_fp16_with_sample_data_keeps_large_activation_nodes(tmp_path: Path) -> None:
    rng = np.random.default_rng()
    model = bn_model(rng)
    result = lower_precision(model, BuildConfig(precision="fp16"), cache_dir=tmp_path, feeds=feeds(rng, 2))
    names = {k["name"] for k in result.record["kept_nodes"]}
    assert {"conv", "bn"} <= names
    session = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = feeds(rng, 1)[0]
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]
    np.testing.assert_allclose(session.run(None, x)[0], ref, rtol=1e-4, atol=1e-3)
