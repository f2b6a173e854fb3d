"""Ceil-mode pooling at every size: the importer module, torch.export and a dynamic CPU plan vs ONNX Runtime.

Regression for issue 11 (item 4): a torch_inductor plan built with a dynamic height/width gave
floor-mode sizes for MaxPool(ceil_mode=1) at odd sizes (13x13 -> 6x6 instead of 7x7), because
AOTInductor decided torch's ceil_mode branch once, at the example size. The importer now lowers
ceil mode to explicit padding plus floor-mode pooling. Sizes are odd and even; the cases cover
the "last window must start inside the input or the begin padding" rule (kernel 1, stride 2),
explicit pads, dilation, count_include_pad and the Indices output. Tolerance: rtol 1e-5,
atol 1e-6 (pooling is exact up to the average's division).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch.export import Dim

from onnx_importer.test_models import ort_run
from streamrt.onnx.importer import export_program, import_onnx

pytestmark = pytest.mark.torch

RTOL, ATOL = 1e-5, 1e-6
SIZES = [(13, 13), (27, 31), (16, 16), (5, 8), (6, 7)]

# name -> (op type, attributes, number of outputs)
CASES: dict[str, tuple[str, dict[str, Any], int]] = {
    "max_2x2_s2": ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}, 1),
    "max_3x3_s2": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2]}, 1),
    "max_3x3_s2_pads": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 1),
    "max_1x1_s2_start_rule": ("MaxPool", {"kernel_shape": [1, 1], "strides": [2, 2]}, 1),
    "max_2x2_s3_end_pads": ("MaxPool", {"kernel_shape": [2, 3], "strides": [3, 2], "pads": [0, 0, 1, 1]}, 1),
    "max_dilated": ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "dilations": [2, 2]}, 1),
    "max_indices": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0]}, 2),
    "avg_2x2_s2": ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2]}, 1),
    "avg_3x3_s2_pads_exclude": (
        "AveragePool",
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 0},
        1,
    ),
    "avg_3x3_s2_pads_include": (
        "AveragePool",
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        1,
    ),
    "avg_1x1_s2_start_rule": ("AveragePool", {"kernel_shape": [1, 1], "strides": [2, 2]}, 1),
    "avg_asym_pads_include": (
        "AveragePool",
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 0, 1], "count_include_pad": 1},
        1,
    ),
}


def _model(op: str, attrs: dict[str, Any], n_out: int, opset: int = 17) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, "h", "w"])
    names = ["y", "indices"][:n_out]
    types = {"y": TensorProto.FLOAT, "indices": TensorProto.INT64}
    outs = [helper.make_tensor_value_info(n, types[n], [None] * 4) for n in names]
    node = helper.make_node(op, ["x"], names, ceil_mode=1, **attrs)
    model = helper.make_model(helper.make_graph([node], "g", [x], outs), opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def _check(name: str, got: Any, expected: list[np.ndarray]) -> None:
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    for g, e in zip(got, expected, strict=True):
        assert tuple(g.shape) == e.shape, f"{name}: shape {tuple(g.shape)} != ONNX Runtime's {e.shape}"
        np.testing.assert_allclose(g.detach().numpy(), e, rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_importer_module_matches_onnxruntime(name: str) -> None:
    model = _model(*CASES[name])
    module = import_onnx(model)
    rng = np.random.default_rng()
    for h, w in SIZES:
        x = rng.standard_normal((2, 3, h, w)).astype(np.float32)
        with torch.no_grad():
            _check(f"{name} at {h}x{w}", module(torch.from_numpy(x)), ort_run(model, {"x": x}))


@pytest.mark.parametrize("name", ["max_2x2_s2", "max_3x3_s2_pads", "max_1x1_s2_start_rule", "avg_3x3_s2_pads_exclude"])
def test_exported_program_with_dynamic_hw_matches_onnxruntime(name: str) -> None:
    model = _model(*CASES[name])
    dims = {2: Dim("h", min=4, max=64), 3: Dim("w", min=4, max=64)}
    program = export_program(model, [torch.randn(2, 3, 16, 16)], (dims,))
    rng = np.random.default_rng()
    for h, w in SIZES:
        x = rng.standard_normal((2, 3, h, w)).astype(np.float32)
        _check(f"{name} at {h}x{w}", program.module()(torch.from_numpy(x)), ort_run(model, {"x": x}))


def _pyramid_model() -> onnx.ModelProto:
    """MaxPool 2x2/2 and 3x3/2 and a padded AveragePool, all ceil mode, one output each."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    nodes = [
        helper.make_node("MaxPool", ["x"], ["a"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        helper.make_node("MaxPool", ["x"], ["b"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        helper.make_node(
            "AveragePool", ["x"], ["c"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1
        ),
    ]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * 4) for n in "abc"]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs), opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.slow
def test_dynamic_torch_inductor_cpu_plan_has_ceil_mode_sizes(tmp_path: Path) -> None:
    import streamrt
    from streamrt.config import BuildConfig
    from streamrt.types import ShapeProfile, ShapeRange

    model = _pyramid_model()
    path = tmp_path / "pool.onnx"
    onnx.save(model, path)
    profile = ShapeProfile({"x": ShapeRange((1, 3, 4, 4), (1, 3, 16, 16), (1, 3, 64, 64))})
    config = BuildConfig(backend="torch_inductor", profiles=(profile,), backend_options={"device": "cpu"})
    plan = streamrt.build(path, config, tmp_path / "pool.plan", cache=False).path
    ctx = streamrt.load(plan).create_context()
    rng = np.random.default_rng()
    for h, w in [(13, 13), (27, 31), (16, 16), (5, 5), (63, 64)]:
        x = rng.standard_normal((1, 3, h, w)).astype(np.float32)
        got = ctx.infer({"x": x})
        for name, want in zip("abc", ort_run(model, {"x": x}), strict=True):
            assert got[name].shape == want.shape, f"output {name} at {h}x{w}: {got[name].shape} != {want.shape}"
            np.testing.assert_allclose(got[name], want, rtol=RTOL, atol=ATOL, err_msg=f"{name} at {h}x{w}")
