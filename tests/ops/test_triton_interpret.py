"""The Triton kernels without a GPU: compiled for sm_90 (type and lowering errors show up here), and run
on CPU tensors through Triton's interpreter against the host ops.

Runs where Triton imports; the interpreter tests also need ``TRITON_INTERPRET=1`` (read when Triton
is imported, so it cannot be switched on from inside the test run):

    TRITON_INTERPRET=1 pytest tests/ops/test_triton_interpret.py

On a GPU machine ``tests/ops/test_gpu_ops.py`` runs the compiled kernels.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import numpy as np
import pytest

from streamrt.ops.letterbox import CpuLetterbox, Normalize
from streamrt.ops.postprocess import CpuPostprocess, PostprocessConfig

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")

torch = pytest.importorskip("torch")

_SIGNATURES = {  # kernel: its argument types and constants (module triton_kernels unless named)
    "_letterbox_kernel": ({"src_ptr": "*u8", "dst_ptr": "*fp16", **dict.fromkeys(
        ("src_h", "src_w", "new_h", "new_w", "top", "left", "out_h", "out_w", "ch0", "ch1", "ch2"), "i32"),
        "src_batch_stride": "i64", "dst_batch_stride": "i64", **dict.fromkeys(
        ("ratio_y", "ratio_x", "scale0", "scale1", "scale2", "shift0", "shift1", "shift2", "pad0", "pad1", "pad2"),
        "fp32"), "BLOCK": "constexpr"}, {"BLOCK": 512}),
    "_nv12_letterbox_kernel": ({"src_ptr": "*u8", "dst_ptr": "*fp16", **dict.fromkeys(
        ("src_h", "src_w", "pitch", "new_h", "new_w", "top", "left", "out_h", "out_w"), "i32"),
        "src_batch_stride": "i64", "dst_batch_stride": "i64", **dict.fromkeys(
        ("ratio_y", "ratio_x", "ky", "kvr", "kug", "kvg", "kub", "scale0", "scale1", "scale2", "shift0", "shift1",
         "shift2", "pad0", "pad1", "pad2"), "fp32"), "RGB_OUT": "constexpr", "BLOCK": "constexpr"},
        {"RGB_OUT": True, "BLOCK": 512}),
    "_nms_mask_kernel": ({"boxes_ptr": "*fp32", "cls_ptr": "*i64", "mask_ptr": "*i64", "K": "i32", "W": "i32",
                          "iou_thr": "fp32", "AGNOSTIC": "constexpr", "ROWS": "constexpr"},
                         {"AGNOSTIC": False, "ROWS": 32}),
    "_nms_scan_kernel": ({"mask_ptr": "*i64", "nvalid_ptr": "*i32", "keep_ptr": "*i64", "count_ptr": "*i32",
                          "K": "i32", "W": "i32", "MAX_DET": "i32", "BLOCK_W": "constexpr"}, {"BLOCK_W": 512}),
    "triton_postprocess._best_scores_kernel": (
        {"view_ptr": "*fp16", "stride_b": "i64", "stride_c": "i64", "stride_n": "i64", "scores_ptr": "*fp16",
         "cls_ptr": "*i64", "N": "i32", "C": "i32", "START": "i32", "conf": "fp32", "OBJECTNESS": "constexpr",
         "BLOCK": "constexpr"}, {"OBJECTNESS": True, "BLOCK": 1024}),
    "triton_postprocess._topk_boxes_kernel": (
        {"view_ptr": "*fp16", "stride_b": "i64", "stride_c": "i64", "stride_n": "i64", "order_ptr": "*i64",
         "sorted_ptr": "*fp16", "cls_ptr": "*i64", "boxes_ptr": "*fp32", "topcls_ptr": "*i64", "nvalid_ptr": "*i32",
         "N": "i32", "K": "i32", "conf": "fp32", "BLOCK": "constexpr"}, {"BLOCK": 1024}),
    "triton_postprocess._gather_detections_kernel": (
        {"keep_ptr": "*i64", "count_ptr": "*i32", "boxes_ptr": "*fp32", "sorted_ptr": "*fp16", "topcls_ptr": "*i64",
         "dets_ptr": "*fp32", "N": "i32", "K": "i32", "M": "i32", "BLOCK": "constexpr"}, {"BLOCK": 512}),
}


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter replaces the compiler")
@pytest.mark.parametrize("name", list(_SIGNATURES))
def test_kernels_compile_for_sm90(name: str) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, _, kernel_name = name.rpartition(".")
    types, constants = _SIGNATURES[name]
    kernel = getattr(importlib.import_module(f"streamrt.ops.{module or 'triton_kernels'}"), kernel_name)
    assert set(types) == set(kernel.arg_names)  # the table names every parameter
    signature = {arg: types[arg] for arg in kernel.arg_names}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constants),
                              target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False})
    assert compiled.asm["cubin"]


@interpreted
@pytest.mark.parametrize(("src", "dst"), [((90, 160), (64, 64)), ((61, 97), (96, 64))])
def test_letterbox_kernel_equals_the_numpy_letterbox(src: tuple[int, int], dst: tuple[int, int]) -> None:
    from streamrt.ops.letterbox_torch import TorchLetterbox

    n = Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    frames = np.random.default_rng(0).integers(0, 256, (2, *src, 3), dtype=np.uint8)
    op = TorchLetterbox(src, dst, n, device="cpu", batch=2, use_triton=True)
    out = torch.full((2, 3, *dst), float("nan"))
    op(torch.from_numpy(frames), out)
    for b in range(2):
        ref = np.empty((3, *dst), np.float32)
        CpuLetterbox(src, dst, n, method="numpy")(frames[b], ref)
        np.testing.assert_allclose(out[b].numpy(), ref, rtol=0, atol=1e-5)


@interpreted
@pytest.mark.parametrize("agnostic", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_nms_kernels_equal_the_numpy_postprocess(agnostic: bool, ties: bool) -> None:
    from streamrt.ops.postprocess_torch import TorchPostprocess

    rng = np.random.default_rng(int(agnostic) * 2 + int(ties))
    batch, n, c = 2, 300, 3
    raw = np.empty((batch, 4 + c, n), np.float32)
    raw[:, 0:2] = rng.uniform(0, 200, (batch, 2, n))
    raw[:, 2:4] = rng.uniform(0, 50, (batch, 2, n))
    raw[:, 2, ::7] = 0  # zero-area boxes
    raw[:, :4, n // 2:] = raw[:, :4, : n - n // 2]  # identical boxes
    scores = rng.random((batch, c, n)).astype(np.float32)
    raw[:, 4:] = np.floor(scores * 4) / 4 if ties else scores
    for cfg in (PostprocessConfig(conf=0.2, iou=0.5, max_det=30, pre_nms_topk=200, class_agnostic=agnostic),
                PostprocessConfig(conf=0.0, iou=0.45, max_det=300, pre_nms_topk=300, class_agnostic=agnostic)):
        ref_d = np.empty((batch, cfg.max_det, 6), np.float32)
        ref_c = np.empty(batch, np.int32)
        CpuPostprocess(cfg, "yolov8", c)(raw, ref_d, ref_c)
        op = TorchPostprocess(cfg, "yolov8", c, n, batch=batch, device="cpu", use_triton=True)
        dets = torch.full((batch, cfg.max_det, 6), float("nan"))
        counts = torch.full((batch,), -1, dtype=torch.int32)
        op(torch.from_numpy(raw), dets, counts)
        assert counts.tolist() == ref_c.tolist()
        np.testing.assert_array_equal(dets.numpy(), ref_d)
