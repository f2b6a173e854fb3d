"""Operator semantics the node tests leave thin, checked against ONNX Runtime on random data.

Attribute-vs-input variants across opsets (Split, Squeeze/Unsqueeze, Reduce*, Clip, Pad), Resize
coordinate/nearest modes, integer division, negative Gather indices and Slice steps, auto_pad,
ceil_mode, count_include_pad, Gemm broadcasting. Parameters are initializers, as exporters write
them. Tolerance: rtol 1e-4, atol 1e-5 (measured <= 2e-6 except cubic Resize, <= 5e-6).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.export import Dim

from onnx_importer.importer_models import single_op
from onnx_importer.test_models import ort_run
from streamrt.onnx.importer import export_program, import_onnx

pytestmark = pytest.mark.torch

RTOL, ATOL = 1e-4, 1e-5

_R = np.random.default_rng()


def f32(*shape: int) -> np.ndarray:
    return _R.standard_normal(shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _resize(mode: str, coord: str, *, scales: list[float] | None = None, sizes: list[int] | None = None, **kw: Any):
    inits = {"roi": np.array([], np.float32)}
    if scales is not None:
        inits["scales"] = np.array(scales, np.float32)
    else:
        inits["scales"] = np.array([], np.float32)
        inits["sizes"] = np.array(sizes, np.int64)
    order = ["x", "roi", "scales"] + (["sizes"] if sizes is not None else [])
    return (
        "Resize",
        {"x": f32(2, 3, 7, 9)},
        1,
        13,
        inits,
        order,
        {"mode": mode, "coordinate_transformation_mode": coord, **kw},
    )


# name -> (op, inputs, n_outputs, opset, initializers, node input order or None, attributes)
CASES: dict[str, tuple[Any, ...]] = {
    "resize_nearest_asym_floor_x2": _resize("nearest", "asymmetric", scales=[1, 1, 2, 2], nearest_mode="floor"),
    "resize_nearest_half_pixel_x1.5": _resize("nearest", "half_pixel", scales=[1, 1, 1.5, 1.5]),
    "resize_nearest_round_prefer_ceil": _resize(
        "nearest", "half_pixel", sizes=[2, 3, 14, 18], nearest_mode="round_prefer_ceil"
    ),
    "resize_nearest_pytorch_half_pixel_ceil": _resize(
        "nearest", "pytorch_half_pixel", sizes=[2, 3, 5, 13], nearest_mode="ceil"
    ),
    "resize_nearest_align_corners": _resize("nearest", "align_corners", sizes=[2, 3, 11, 4]),
    "resize_linear_half_pixel_down": _resize("linear", "half_pixel", scales=[1, 1, 0.6, 0.7]),
    "resize_linear_align_corners": _resize("linear", "align_corners", sizes=[2, 3, 12, 5]),
    "resize_linear_asymmetric": _resize("linear", "asymmetric", scales=[1, 1, 2, 1.5]),
    "resize_linear_pytorch_half_pixel": _resize("linear", "pytorch_half_pixel", sizes=[2, 3, 1, 17]),
    "resize_cubic_half_pixel": _resize("cubic", "half_pixel", scales=[1, 1, 1.7, 2]),
    "resize_cubic_a05_exclude_outside": _resize(
        "cubic", "asymmetric", scales=[1, 1, 0.8, 1.3], cubic_coeff_a=-0.5, exclude_outside=1
    ),
    "resize_opset11_tf_half_pixel_for_nn": (
        "Resize",
        {"x": f32(1, 2, 5, 6)},
        1,
        11,
        {"roi": np.array([], np.float32), "scales": np.array([1, 1, 1.6, 2.5], np.float32)},
        None,
        {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"},
    ),
    "div_int64_truncates": ("Div", {"a": i64(-7, 7, -9, 9, 5), "b": i64(2, -2, 4, -4, 5)}, 1, 14, {}, None, {}),
    "mod_int_sign_of_divisor": ("Mod", {"a": i64(-7, 7, -9, 9), "b": i64(3, -3, 4, -4)}, 1, 13, {}, None, {}),
    "mod_fmod_float": ("Mod", {"a": f32(4, 5), "b": np.full((4, 5), 0.7, np.float32)}, 1, 13, {}, None, {"fmod": 1}),
    "gather_negative_indices": (
        "Gather",
        {"x": f32(3, 5, 2)},
        1,
        13,
        {"idx": np.array([[-1, 0], [-5, 2]], np.int64)},
        None,
        {"axis": 1},
    ),
    "gather_scalar_index": ("Gather", {"x": f32(4, 3)}, 1, 13, {"idx": np.array(-2, np.int64)}, None, {"axis": 0}),
    "slice_negative_steps": (
        "Slice",
        {"x": f32(6, 7, 4)},
        1,
        13,
        {"starts": i64(-1, 5), "ends": i64(-(2**62), 0), "axes": i64(0, 1), "steps": i64(-2, -3)},
        None,
        {},
    ),
    "slice_clamped_bounds": (
        "Slice",
        {"x": f32(5, 6)},
        1,
        13,
        {"starts": i64(-100, 2), "ends": i64(100, -1), "axes": i64(0, -1)},
        None,
        {},
    ),
    "split_opset11_attr": ("Split", {"x": f32(7, 4)}, 2, 11, {}, None, {"axis": 0, "split": [3, 4]}),
    "split_opset13_input": ("Split", {"x": f32(4, 9)}, 3, 13, {"split": i64(2, 3, 4)}, None, {"axis": 1}),
    "split_opset18_num_outputs_uneven": ("Split", {"x": f32(4, 10)}, 3, 18, {}, None, {"axis": 1, "num_outputs": 3}),
    "squeeze_opset11_attr": ("Squeeze", {"x": f32(1, 3, 1, 2)}, 1, 11, {}, None, {"axes": [0, -2]}),
    "squeeze_opset13_input": ("Squeeze", {"x": f32(1, 3, 1, 2)}, 1, 13, {"axes": i64(2)}, None, {}),
    "unsqueeze_opset11_attr": ("Unsqueeze", {"x": f32(3, 2)}, 1, 11, {}, None, {"axes": [0, 3]}),
    "unsqueeze_opset13_input": ("Unsqueeze", {"x": f32(3, 2)}, 1, 13, {"axes": i64(-1, 1)}, None, {}),
    "reducesum_opset11_attr": ("ReduceSum", {"x": f32(3, 4, 5)}, 1, 11, {}, None, {"axes": [0, 2], "keepdims": 0}),
    "reducesum_opset13_input": ("ReduceSum", {"x": f32(3, 4, 5)}, 1, 13, {"axes": i64(-1)}, None, {}),
    "reducesum_noop_empty_axes": ("ReduceSum", {"x": f32(3, 4)}, 1, 13, {}, None, {"noop_with_empty_axes": 1}),
    "reducemean_opset18_input": ("ReduceMean", {"x": f32(3, 4, 5)}, 1, 18, {"axes": i64(1)}, None, {"keepdims": 0}),
    "reducemax_opset11_all": ("ReduceMax", {"x": f32(3, 4, 5)}, 1, 11, {}, None, {"keepdims": 1}),
    "clip_max_only": ("Clip", {"x": f32(4, 5)}, 1, 13, {"hi": np.array(0.3, np.float32)}, ["x", "", "hi"], {}),
    "clip_int_min_only": ("Clip", {"x": i64(-5, 0, 5)}, 1, 13, {"lo": np.array(-1, np.int64)}, ["x", "lo"], {}),
    "pad_reflect": ("Pad", {"x": f32(2, 4, 5)}, 1, 13, {"pads": i64(0, 2, 3, 0, 1, 4)}, None, {"mode": "reflect"}),
    "pad_edge_axes_opset18": (
        "Pad",
        {"x": f32(2, 4, 5)},
        1,
        18,
        {"pads": i64(1, 2, 3, 0), "axes": i64(2, 0)},
        ["x", "pads", "", "axes"],
        {"mode": "edge"},
    ),
    "pad_wrap_opset19": ("Pad", {"x": f32(3, 4)}, 1, 19, {"pads": i64(1, 2, 2, 3)}, None, {"mode": "wrap"}),
    "pad_constant_value": (
        "Pad",
        {"x": f32(3, 4)},
        1,
        13,
        {"pads": i64(1, 0, 0, 2), "v": np.array(1.5, np.float32)},
        None,
        {},
    ),
    "conv_same_upper_stride2": (
        "Conv",
        {"x": f32(2, 3, 9, 8)},
        1,
        13,
        {"w": f32(4, 3, 3, 3), "b": f32(4)},
        None,
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    ),
    "conv_same_lower_strided_groups": (
        "Conv",
        {"x": f32(1, 4, 7, 7)},
        1,
        13,
        {"w": f32(4, 2, 2, 2)},
        None,
        {"auto_pad": "SAME_LOWER", "strides": [2, 2], "group": 2},
    ),
    "conv_asymmetric_pads_1d": ("Conv", {"x": f32(2, 3, 10)}, 1, 13, {"w": f32(5, 3, 4)}, None, {"pads": [2, 0]}),
    "conv_transpose_output_padding": (
        "ConvTranspose",
        {"x": f32(1, 4, 5, 5)},
        1,
        13,
        {"w": f32(4, 3, 3, 3), "b": f32(3)},
        None,
        {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 1]},
    ),
    "conv_transpose_same_upper": (
        "ConvTranspose",
        {"x": f32(1, 2, 4, 3)},
        1,
        13,
        {"w": f32(2, 3, 3, 3)},
        None,
        {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    ),
    "conv_transpose_output_shape": (
        "ConvTranspose",
        {"x": f32(1, 2, 4, 4)},
        1,
        13,
        {"w": f32(2, 2, 3, 3)},
        None,
        {"strides": [3, 2], "output_shape": [12, 9]},
    ),
    "maxpool_ceil_mode_pads": (
        "MaxPool",
        {"x": f32(2, 2, 9, 8)},
        1,
        13,
        {},
        None,
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    ),
    "maxpool_dilated_with_indices": (
        "MaxPool",
        {"x": f32(2, 3, 8, 8)},
        2,
        13,
        {},
        None,
        {"kernel_shape": [2, 2], "dilations": [2, 2]},
    ),
    "maxpool_same_upper_asymmetric": (
        "MaxPool",
        {"x": f32(1, 1, 6, 7)},
        1,
        13,
        {},
        None,
        {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    ),
    "avgpool_count_include_pad_ceil": (
        "AveragePool",
        {"x": f32(1, 2, 7, 6)},
        1,
        13,
        {},
        None,
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 0], "ceil_mode": 1, "count_include_pad": 1},
    ),
    "avgpool_exclude_pad": (
        "AveragePool",
        {"x": f32(1, 2, 7, 6)},
        1,
        13,
        {},
        None,
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
    ),
    "gemm_broadcast_c_row": (
        "Gemm",
        {"a": f32(4, 3)},
        1,
        13,
        {"b": f32(5, 3), "c": f32(1, 5)},
        None,
        {"transB": 1, "alpha": 0.5, "beta": 2.0},
    ),
    "gemm_broadcast_c_column_transA": (
        "Gemm",
        {"a": f32(3, 4)},
        1,
        13,
        {"b": f32(3, 5), "c": f32(4, 1)},
        None,
        {"transA": 1},
    ),
    "gemm_scalar_c": ("Gemm", {"a": f32(2, 3)}, 1, 13, {"b": f32(3, 4), "c": np.array(0.25, np.float32)}, None, {}),
    "softmax_opset11_flattens": ("Softmax", {"x": f32(2, 3, 4, 2)}, 1, 11, {}, None, {"axis": 1}),
    "logsoftmax_opset13_axis": ("LogSoftmax", {"x": f32(2, 3, 4)}, 1, 13, {}, None, {"axis": 1}),
    "topk_smallest": ("TopK", {"x": f32(3, 8)}, 2, 11, {"k": i64(3)}, None, {"largest": 0}),
    "expand_keeps_larger_dims": ("Expand", {"x": f32(3, 1, 4)}, 1, 13, {"shape": i64(2, 1, 5, 1)}, None, {}),
    "cast_float_to_int_truncates": (
        "Cast",
        {"x": np.array([-2.7, -0.5, 0.5, 2.7], np.float32)},
        1,
        13,
        {},
        None,
        {"to": 7},
    ),
    "layernorm_axis1": (
        "LayerNormalization",
        {"x": f32(2, 3, 4)},
        1,
        17,
        {"s": f32(3, 4), "b": f32(3, 4)},
        None,
        {"axis": 1},
    ),
    "instancenorm": ("InstanceNormalization", {"x": f32(2, 3, 5, 4)}, 1, 13, {"s": f32(3), "b": f32(3)}, None, {}),
    "depth_to_space_crd": ("DepthToSpace", {"x": f32(1, 8, 2, 3)}, 1, 13, {}, None, {"blocksize": 2, "mode": "CRD"}),
    "cumsum_reverse_exclusive": (
        "CumSum",
        {"x": f32(3, 4)},
        1,
        14,
        {"axis": np.array(1, np.int64)},
        None,
        {"reverse": 1, "exclusive": 1},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_onnxruntime(name: str) -> None:
    op, inputs, n_out, opset, inits, order, attrs = CASES[name]
    model = single_op(op, inputs, n_out, opset=opset, initializers=inits, node_inputs=order, **attrs)
    expected = ort_run(model, inputs)
    with torch.no_grad():
        got = import_onnx(model)(*[torch.from_numpy(v) for v in inputs.values()])
    for g, e in zip(got, expected, strict=True):
        assert g.numpy().dtype == e.dtype, name
        assert g.shape == e.shape, name
        np.testing.assert_allclose(g.numpy(), e, rtol=RTOL, atol=ATOL, err_msg=name)


# name -> (case, dynamic dims of the first input, two test shapes)
DYNAMIC: dict[str, tuple[str, dict[int, Any], list[tuple[int, ...]]]] = {
    "resize_general_path_dynamic_hw": (
        "resize_nearest_half_pixel_x1.5",
        {2: Dim("h", min=2, max=64), 3: Dim("w", min=2, max=64)},
        [(2, 3, 5, 11)],
    ),
    "resize_linear_dynamic_batch": ("resize_linear_half_pixel_down", {0: Dim("b", min=1, max=8)}, [(5, 3, 7, 9)]),
    "slice_negative_steps_dynamic": (
        "slice_negative_steps",
        {0: Dim("n", min=3, max=64), 1: Dim("m", min=6, max=64)},
        [(9, 6, 4), (3, 12, 4)],
    ),
    "conv_same_upper_dynamic_hw": (
        "conv_same_upper_stride2",
        {2: Dim("h", min=4, max=64), 3: Dim("w", min=4, max=64)},
        [(2, 3, 11, 6)],
    ),
    "pad_reflect_dynamic": ("pad_reflect", {2: Dim("n", min=5, max=64)}, [(2, 4, 9)]),
    # ceil_mode with dynamic spatial dims: test_ceil_pooling.py.
    "maxpool_ceil_dynamic_batch": ("maxpool_ceil_mode_pads", {0: Dim("b", min=1, max=8)}, [(3, 2, 9, 8)]),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_exports_with_dynamic_dims(name: str) -> None:
    case, dims, shapes = DYNAMIC[name]
    op, inputs, n_out, opset, inits, order, attrs = CASES[case]
    model = single_op(op, inputs, n_out, opset=opset, initializers=inits, node_inputs=order, dynamic=True, **attrs)
    example = [torch.from_numpy(v) for v in inputs.values()]
    program = export_program(model, example, (dims,))
    for shape in shapes:
        x = _R.standard_normal(shape).astype(np.float32)
        expected = ort_run(model, {next(iter(inputs)): x})
        got = program.module()(torch.from_numpy(x))
        for g, e in zip(got, expected, strict=True):
            assert tuple(g.shape) == e.shape, name
            np.testing.assert_allclose(g.detach().numpy(), e, rtol=RTOL, atol=ATOL, err_msg=name)
