"""Hand-built models through the importer, compared with ONNX Runtime on fresh random inputs.

Tolerances, measured on this CPU when they were set (max abs difference vs ORT fp32):

- fp32 models: at most 1.5e-6 absolute on outputs up to ~5 in magnitude (bound: rtol 1e-4, atol 1e-5).
- fp16 weights and compute vs ORT fp32, max error / max |output|, 10 seeds: classifier
  0.03-0.12 %, transformer block 0.06-0.08 % (bound 1 %).
- bf16 the same way: classifier 0.4-1.0 %, transformer block 0.5-0.7 % (bound 5 %).
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, numpy_helper

from onnx_importer.importer_models import conv_classifier, flatten_by_shape, transformer_block, yolo_head
from streamrt.onnx.importer import import_onnx

pytestmark = pytest.mark.torch

RTOL, ATOL = 1e-4, 1e-5
FP16_BOUND, BF16_BOUND = 1e-2, 5e-2


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, feeds)]


def run_importer(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], dtype: torch.dtype | None = None
) -> list[np.ndarray]:
    module = import_onnx(model)
    args = [torch.from_numpy(v) for v in feeds.values()]
    if dtype is not None:
        args = [a.to(dtype) if a.is_floating_point() else a for a in args]
    with torch.no_grad():
        return [o.float().numpy() if o.is_floating_point() else o.numpy() for o in module(*args)]


def images(rng: np.random.Generator, *shape: int) -> dict[str, np.ndarray]:
    return {"images": rng.standard_normal(shape).astype(np.float32)}


def tokens(rng: np.random.Generator, batch: int, seq: int) -> dict[str, np.ndarray]:
    mask = rng.random((batch, seq)) > 0.3
    mask[:, 0] = True  # at least one visible token per row
    return {"tokens": rng.integers(0, 50, (batch, seq)).astype(np.int64), "mask": mask}


CASES: dict[str, tuple[Callable[[np.random.Generator], onnx.ModelProto], Callable[[np.random.Generator], dict]]] = {
    "conv_bn_relu_classifier": (conv_classifier, lambda rng: images(rng, 3, 3, 32, 32)),
    "yolo_head": (yolo_head, lambda rng: images(rng, 2, 3, 64, 96)),
    "transformer_block": (transformer_block, lambda rng: tokens(rng, 3, 9)),
    "flatten_by_shape": (flatten_by_shape, lambda rng: {"x": rng.standard_normal((5, 4, 5, 6)).astype(np.float32)}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_onnxruntime(name: str) -> None:
    rng = np.random.default_rng()
    build, make_feeds = CASES[name]
    model = build(rng)
    for _ in range(2):  # fresh inputs each round
        feeds = make_feeds(rng)
        expected = ort_run(model, feeds)
        got = run_importer(model, feeds)
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)


def test_outputs_are_fresh_tensors_not_poisoned_buffers() -> None:
    rng = np.random.default_rng()
    model = conv_classifier(rng)
    module = import_onnx(model)
    feeds = images(rng, 2, 3, 32, 32)
    (first,) = module(torch.from_numpy(feeds["images"]))
    first.fill_(float("nan"))  # poison the returned tensor: the next call must not reuse it
    (second,) = module(torch.from_numpy(feeds["images"]))
    np.testing.assert_allclose(second.numpy(), ort_run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def _to_precision(model: onnx.ModelProto, elem_type: int) -> onnx.ModelProto:
    """Cast float initializers and float graph inputs/outputs to fp16 or bf16."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for i, init in enumerate(out.graph.initializer):
        if init.data_type != TensorProto.FLOAT:
            continue
        array = numpy_helper.to_array(init)
        if elem_type == TensorProto.FLOAT16:
            new = numpy_helper.from_array(np.clip(array, -65504, 65504).astype(np.float16), init.name)
        else:
            raw = array.astype(ml_dtypes.bfloat16).view(np.uint16).tobytes()
            new = onnx.helper.make_tensor(init.name, elem_type, array.shape, raw, raw=True)
        out.graph.initializer[i].CopyFrom(new)
    for value in [*out.graph.input, *out.graph.output]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = elem_type
    onnx.checker.check_model(out)
    return out


@pytest.mark.parametrize(
    ("elem_type", "dtype", "bound"),
    [(TensorProto.FLOAT16, torch.float16, FP16_BOUND), (TensorProto.BFLOAT16, torch.bfloat16, BF16_BOUND)],
    ids=["fp16", "bf16"],
)
@pytest.mark.parametrize("name", ["conv_bn_relu_classifier", "transformer_block"])
def test_half_precision_models(name: str, elem_type: int, dtype: torch.dtype, bound: float) -> None:
    rng = np.random.default_rng()
    build, make_feeds = CASES[name]
    model = build(rng)
    half = _to_precision(model, elem_type)
    module = import_onnx(half)
    assert {b.dtype for b in module.buffers()} == {dtype}
    feeds = make_feeds(rng)
    expected = ort_run(model, feeds)
    args = [torch.from_numpy(v).to(dtype) if v.dtype == np.float32 else torch.from_numpy(v) for v in feeds.values()]
    with torch.no_grad():
        got = module(*args)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == dtype
        error = np.abs(g.float().numpy() - e).max() / np.abs(e).max()
        assert error < bound, f"{name} {dtype}: relative max error {error:.2e}"
