"""The architecture zoo on every backend that runs on the CPU, fp32 against ONNX Runtime.

Each model is exported from PyTorch (fixed seeds) and run at its profile's opt shape and at an
odd in-profile shape on fresh random inputs: PyTorch eager, an onnxruntime plan and the
importer's torch module must agree with an ONNX Runtime session on the exported model within
1e-4 relative L2 (measured <= 6e-7). Two models also go through a dynamic torch_inductor CPU plan
(those builds take about a minute each on 2 cores): MTCNN's P-Net (ceil-mode pooling at odd
sizes) and the U-Net (ConvTranspose, Resize, a multiple-of-4 constraint).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

import streamrt
from streamrt.building.verify import corner_shapes
from streamrt.config import BuildConfig
from streamrt.errors import ShapeError
from streamrt.onnx.importer import import_onnx
from streamrt.testing.zoo import INPUT, MODELS, ZooModel, export
from streamrt.types import Shape

pytestmark = pytest.mark.torch

TOLERANCE = 1e-4


def rel_l2(ref: np.ndarray, got: np.ndarray) -> float:
    ref64 = ref.astype(np.float64)
    return float(np.linalg.norm(ref64 - got) / max(np.linalg.norm(ref64), 1e-30))


def _shapes(entry: ZooModel) -> list[Shape]:
    corners = dict(corner_shapes(entry.profile))
    return [corners["opt"][INPUT], corners.get("odd", corners["max"])[INPUT]]


def _as_list(out: object) -> list[np.ndarray]:
    values = [out] if isinstance(out, torch.Tensor) else list(out)  # type: ignore[call-overload]
    return [v.detach().numpy() for v in values]


def _check(label: str, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want), label
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, f"{label}, output {i}: shape {g.shape} != ONNX Runtime's {w.shape}"
        assert rel_l2(w, g) <= TOLERANCE, f"{label}, output {i}: relative L2 error {rel_l2(w, g):.2e}"


def test_entries_describe_themselves() -> None:
    assert set(MODELS) == {"resnet", "mobilenet", "vit", "crnn", "unet", "yolo", "mtcnn"}
    for name, entry in MODELS.items():
        net, shape, profile = entry()
        assert shape == profile.ranges[INPUT].opt, name
        again = entry.make().state_dict()
        assert all(torch.equal(v, again[k]) for k, v in net.state_dict().items()), f"{name} is not deterministic"
        assert not net.training


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cpu_backends_match_onnxruntime(name: str, tmp_path: Path) -> None:
    entry = MODELS[name]
    path = export(name, tmp_path / f"{name}.onnx", opset=17)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    plan = streamrt.build(path, BuildConfig(profiles=(entry.profile,)), tmp_path / f"{name}.plan", cache=False)
    ctx = streamrt.load(plan.path).create_context()
    net, module = entry.make(), import_onnx(str(path))
    rng = np.random.default_rng()
    for shape in _shapes(entry):
        x = rng.standard_normal(shape).astype(np.float32)
        want = [np.asarray(o) for o in session.run(None, {INPUT: x})]
        with torch.no_grad():
            _check(f"{name} eager at {shape}", _as_list(net(torch.from_numpy(x))), want)
            _check(f"{name} importer at {shape}", _as_list(module(torch.from_numpy(x))), want)
        outputs = ctx.infer({INPUT: x})
        _check(f"{name} onnxruntime plan at {shape}", [outputs[o] for o in entry.outputs], want)
    multiple = entry.profile.ranges[INPUT].multiple
    if multiple:  # sizes the model cannot run at are refused, not computed
        off = tuple(d + (1 if m > 1 else 0) for d, m in zip(entry.example_shape, multiple, strict=True))
        with pytest.raises(ShapeError, match="must be a multiple of"):
            ctx.infer({INPUT: rng.standard_normal(off).astype(np.float32)})


@pytest.mark.parametrize("name", sorted(MODELS))
def test_exports_at_opset_11(name: str, tmp_path: Path) -> None:
    entry = MODELS[name]
    path = export(name, tmp_path / f"{name}-11.onnx", opset=11)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng().standard_normal(entry.example_shape).astype(np.float32)
    with torch.no_grad():
        _check(f"{name} opset 11", _as_list(entry.make()(torch.from_numpy(x))), session.run(None, {INPUT: x}))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mtcnn", "unet"])
def test_dynamic_torch_inductor_cpu_plan_matches_onnxruntime(name: str, tmp_path: Path) -> None:
    entry = MODELS[name]
    path = export(name, tmp_path / f"{name}.onnx", opset=17)
    config = BuildConfig(backend="torch_inductor", profiles=(entry.profile,), backend_options={"device": "cpu"})
    plan = streamrt.build(path, config, tmp_path / f"{name}.plan", cache=False)
    assert len(plan.manifest.extra["shape_verification"]["checks"]) == 4  # verified at build, by default
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ctx = streamrt.load(plan.path).create_context()
    rng = np.random.default_rng()
    r = entry.profile.ranges[INPUT]
    for shape in [*_shapes(entry), r.min]:
        x = rng.standard_normal(shape).astype(np.float32)
        outputs = ctx.infer({INPUT: x})
        want = [np.asarray(o) for o in session.run(None, {INPUT: x})]
        _check(f"{name} torch_inductor plan at {shape}", [outputs[o] for o in entry.outputs], want)
