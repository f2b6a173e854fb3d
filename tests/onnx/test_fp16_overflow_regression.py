"""Issue 11's fp16 regression, written against the API that existed before the fix.

BatchNormalization variances of 1e3..1e8 arriving through a Constant node: the old conversion
clamped them to 65504 with no warning (cosine 0.975 here; 0.43 on the real text detector). It
must now keep cosine >= 0.999 vs fp32 with no flags. Fresh random weights and inputs every run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from precision_models import bn_model
from streamrt.config import BuildConfig
from streamrt.onnx.precision import apply_precision

MIN_COSINE = 0.999


def test_fp16_with_overflowing_bn_statistics_in_a_constant_keeps_cosine(tmp_path: Path) -> None:
    rng = np.random.default_rng()
    model = bn_model(rng)
    half = apply_precision(model, BuildConfig(precision="fp16"), cache_dir=tmp_path)
    fp32 = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    fp16 = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(3):
        x = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
        a = fp32.run(None, x)[0].astype(np.float64).ravel()
        b = fp16.run(None, x)[0].astype(np.float64).ravel()
        cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        assert cosine >= MIN_COSINE, f"fp16 cosine {cosine:.4f} vs fp32 (BN variances clamped to 65504?)"
