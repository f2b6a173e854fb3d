"""int8 results must not depend on the CPU's int8 instructions (issue 24, item 1).

On a fresh AVX2-only machine (no VNNI) the int8 accuracy tests scored 0.75-0.78 top-1 agreement
where VNNI machines scored ~0.96: ONNX Runtime fused the test CNN's ``DQ -> Gemm`` into a
``QGemm`` whose x86 kernel without VNNI multiplies byte pairs with ``VPMADDUBSW`` and saturates
their int16 sum. These tests pin the fix without needing such a CPU:

- an exact numpy model of the quantized Gemm, and a model of the saturating kernel, show that
  saturation changes the answer on this very model (so the difference is real, not noise);
- the reference runner (accuracy gate, sensitivity pass, these tests) gives the exact answer,
  because it runs Q/DQ models as written, with no integer fusion that could pick such a kernel;
- the ONNX Runtime backend's sessions ask for ONNX Runtime's own remedy
  (``session.x64quantprecision``: weights that could overflow go to its non-saturating u8u8
  kernels), so CPU int8 plans built on such a CPU are exact too.

On a VNNI machine the old code also passed the exactness check (VNNI does not saturate); the
structural checks below fail on the old code anywhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from tests.onnx.test_precision import CALIBRATION_SAMPLES, balanced_cnn, images, int8_config, save_samples

from streamrt.backends.onnxruntime.session import session_options
from streamrt.onnx.precision import apply_precision
from streamrt.onnx.runner import onnx_runner, reference_options

#: Relative L2 error allowed between ONNX Runtime's float evaluation of the Q/DQ graph and the
#: exact integer model: only fp32 rounding of the dequantized products separates them.
EXACT_REL = 1e-5


def _init(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def _gemm_parts(model: onnx.ModelProto) -> tuple[onnx.NodeProto, dict[str, onnx.NodeProto]]:
    producers = {out: node for node in model.graph.node for out in node.output}
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    return gemm, producers


def _emulate_gemm(quantized: onnx.ModelProto, features: np.ndarray, *, saturate: bool) -> np.ndarray:
    """The quantized classifier's logits from its float input, in integer arithmetic.

    ``saturate`` models the x86 u8s8 kernel without VNNI: the int8 activations are shifted to
    uint8 (ONNX Runtime's S8->U8 conversion), and each adjacent pair of byte products is summed
    into a saturating int16 (``VPMADDUBSW``) before the int32 accumulation.
    """
    gemm, producers = _gemm_parts(quantized)
    dq_a, dq_w, dq_b = (producers[name] for name in gemm.input)
    q_a = producers[dq_a.input[0]]
    a_scale, a_zero = _init(quantized, q_a.input[1]), _init(quantized, q_a.input[2])
    a_q = np.clip(np.rint(features / a_scale) + a_zero.astype(np.int64), -128, 127).astype(np.int64)
    a_q -= int(a_zero)
    w_q = _init(quantized, dq_w.input[0]).astype(np.int64)  # (classes, K), transB=1
    w_scale = _init(quantized, dq_w.input[1]).astype(np.float64)
    bias = _init(quantized, dq_b.input[0]).astype(np.float64) * _init(quantized, dq_b.input[1])
    if saturate:
        u = a_q + 128  # uint8 activations; the +128 is taken back out through the weight sums
        k = u.shape[1] - u.shape[1] % 2
        pairs = u[:, None, 0:k:2] * w_q[None, :, 0:k:2] + u[:, None, 1:k:2] * w_q[None, :, 1:k:2]
        acc = np.clip(pairs, -32768, 32767).sum(-1)
        if k < u.shape[1]:
            acc += u[:, -1:] @ w_q[:, -1:].T
        acc -= 128 * w_q.sum(1)[None, :]
    else:
        acc = a_q @ w_q.T
    return (acc * float(a_scale) * w_scale[None, :] + bias[None, :]).astype(np.float32)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> onnx.ModelProto:
    tmp = tmp_path_factory.mktemp("int8")
    data = save_samples(tmp / "calib", images(CALIBRATION_SAMPLES, np.random.default_rng()))
    return apply_precision(balanced_cnn(), int8_config(data), cache_dir=tmp / "cache")


def _features(quantized: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The classifier's float input ``f``, exposed as an extra output of the Q/DQ graph."""
    probe = onnx.ModelProto()
    probe.CopyFrom(quantized)
    probe.graph.output.append(helper.make_tensor_value_info("f", onnx.TensorProto.FLOAT, None))
    return np.asarray(onnx_runner(probe)({"x": x})["f"])


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_the_reference_computes_exact_int8_not_the_saturating_kernel(quantized: onnx.ModelProto) -> None:
    x = images(256, np.random.default_rng())
    features = _features(quantized, x)
    exact = _emulate_gemm(quantized, features, saturate=False)
    saturated = _emulate_gemm(quantized, features, saturate=True)
    # Saturation matters on this model: the fresh-machine failure is reproduced by the model of it.
    assert _rel(saturated, exact) > 0.05, _rel(saturated, exact)
    got = np.asarray(onnx_runner(quantized)({"x": x})["logits"])
    assert _rel(got, exact) <= EXACT_REL, (_rel(got, exact), _rel(got, saturated))


def test_the_reference_runs_qdq_models_without_integer_fusion(quantized: onnx.ModelProto, tmp_path: Path) -> None:
    options = reference_options(quantized)
    options.optimized_model_filepath = str(tmp_path / "seen.onnx")
    ort.InferenceSession(quantized.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ops = {n.op_type for n in onnx.load(str(tmp_path / "seen.onnx")).graph.node}
    assert not ops & {"QGemm", "QLinearConv", "QLinearMatMul", "MatMulIntegerToFloat", "ConvInteger"}, ops
    # Float models keep every optimization (the reference stays fast for them).
    assert reference_options(balanced_cnn()).graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_backend_sessions_ask_for_non_saturating_int8_kernels(level: int) -> None:
    options = session_options({}, level)
    assert options.get_session_config_entry("session.x64quantprecision") == "1"
