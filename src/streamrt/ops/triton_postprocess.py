"""Triton kernels around the NMS of :class:`~streamrt.ops.postprocess_torch.TorchPostprocess`: one launch each
for the steps that took a dozen small torch operations.

Without CUDA graphs every operation of the post-processing is a launch paid on the host, with the GIL held,
once per frame: on the H100 on 2026-12-06 the post stage cost 0.47 ms per frame on the thread that binds the
detector's streams lane (docs/benchmarks/2026-12-06-h100-s2.md). These three kernels replace ~21 of its ~25
launches:

* :func:`best_scores`: each anchor's best class score (times objectness) and class, under the threshold set to
  -1 (torch.max, a multiply and a masked fill before);
* :func:`topk_boxes` gathers the top-``K`` anchors (by the sorted order) from the raw output in any layout
  (strides), decodes centre/size to x1/y1/x2/y2 in float32, gathers their classes and counts the candidates at
  or above the threshold; one program per image.
* :func:`gather_detections` writes the ``(max_det, 6)`` rows of each image from the kept indices (box, score,
  class) and zeros past the kept count; one program per image. Rows past the count are never read, so the
  keep buffer needs no clearing before the scan.

The arithmetic is the torch version's: ``cx - 0.5 * w`` in float32 (a product by 0.5 is exact, so with or
without a fused multiply-add it rounds once), scores compared with the threshold rounded to the scores' dtype
(as torch compares a half tensor with a Python float). Tested on the CPU with ``TRITON_INTERPRET=1`` against
:class:`~streamrt.ops.postprocess.CpuPostprocess` (equal outputs), and compiled for sm_90.
"""

# Kernel parameters stay unannotated: Triton reads annotations as specialisation hints.
# mypy: disable-error-code="no-untyped-def,attr-defined"

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

__all__ = ["best_scores", "gather_detections", "topk_boxes"]

_BLOCK = 1024  # candidates or output rows per loop step of a program


@triton.jit
def _best_scores_kernel(view_ptr, stride_b, stride_c, stride_n, scores_ptr, cls_ptr, N, C, START, conf,
                        OBJECTNESS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    n = pid * BLOCK + tl.arange(0, BLOCK)
    m = n < N
    raw = view_ptr + b * stride_b + n.to(tl.int64) * stride_n
    best = tl.load(raw + START * stride_c, mask=m, other=0.0)
    best_c = tl.zeros([BLOCK], dtype=tl.int64)
    for c in range(1, C):
        v = tl.load(raw + (START + c) * stride_c, mask=m, other=0.0)
        better = v > best  # strictly: the first of equal maxima, as torch.max
        best = tl.where(better, v, best)
        best_c = tl.where(better, c, best_c)
    if OBJECTNESS:  # in the scores' dtype, as torch's in-place multiply (one rounding of an exact product)
        best = (best.to(tl.float32) * tl.load(raw + 4 * stride_c, mask=m, other=0.0).to(tl.float32)).to(best.dtype)
    best = tl.where(best.to(tl.float32) < conf, -1.0, best.to(tl.float32)).to(best.dtype)
    tl.store(scores_ptr + b * N + n, best, mask=m)
    tl.store(cls_ptr + b * N + n, best_c, mask=m)


def best_scores(view: Any, scores: Any, classes: Any, start: int, num_classes: int, objectness: bool,
                conf: float) -> None:
    """``scores[b, n]`` = the best class score of anchor ``n`` (times its objectness), -1 where under ``conf``;
    ``classes[b, n]`` = that class (the first of equal maxima).

    Args:
        view: raw output as (B, channels, anchors), any strides; class scores from channel ``start``,
            objectness in channel 4.
        scores: (B, anchors) in the raw output's dtype, contiguous. classes: (B, anchors) int64, contiguous.
        conf: the threshold, already rounded to the scores' dtype.
    """
    batch, _, n = view.shape
    grid = (triton.cdiv(n, _BLOCK), batch)
    _best_scores_kernel[grid](view, view.stride(0), view.stride(1), view.stride(2), scores, classes, n, num_classes,
                              start, conf, OBJECTNESS=objectness, BLOCK=_BLOCK, enable_fp_fusion=False)


@triton.jit
def _topk_boxes_kernel(view_ptr, stride_b, stride_c, stride_n, order_ptr, sorted_ptr, cls_ptr, boxes_ptr, topcls_ptr,
                       nvalid_ptr, N, K, conf, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    raw = view_ptr + b * stride_b
    count = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, K, BLOCK):
        i = start + tl.arange(0, BLOCK)
        m = i < K
        idx = tl.load(order_ptr + b * N + i, mask=m, other=0)
        cx = tl.load(raw + idx * stride_n, mask=m, other=0.0).to(tl.float32)
        cy = tl.load(raw + stride_c + idx * stride_n, mask=m, other=0.0).to(tl.float32)
        w = tl.load(raw + 2 * stride_c + idx * stride_n, mask=m, other=0.0).to(tl.float32)
        h = tl.load(raw + 3 * stride_c + idx * stride_n, mask=m, other=0.0).to(tl.float32)
        out = boxes_ptr + b * 4 * K + i
        tl.store(out, cx - 0.5 * w, mask=m)
        tl.store(out + K, cy - 0.5 * h, mask=m)
        tl.store(out + 2 * K, cx + 0.5 * w, mask=m)
        tl.store(out + 3 * K, cy + 0.5 * h, mask=m)
        tl.store(topcls_ptr + b * K + i, tl.load(cls_ptr + b * N + idx, mask=m, other=0), mask=m)
        score = tl.load(sorted_ptr + b * N + i, mask=m, other=0.0).to(tl.float32)
        count += ((score >= conf) & m).to(tl.int32)
    tl.store(nvalid_ptr + b, tl.sum(count, axis=0))


def topk_boxes(view: Any, order: Any, sorted_scores: Any, classes: Any, boxes: Any, top_classes: Any,
               n_valid: Any, conf: float) -> None:
    """For each image ``b`` and ``i < K``: ``boxes[b, :, i]`` = anchor ``order[b, i]``'s box as x1/y1/x2/y2
    float32, ``top_classes[b, i]`` = its class, and ``n_valid[b]`` = how many of ``sorted_scores[b, :K]`` are
    ``>= conf``.

    Args:
        view: raw output as (B, channels, anchors), any strides (boxes in channels 0-3 as cx, cy, w, h).
        order, sorted_scores, classes: (B, anchors), contiguous: the sort's indices and values, and each
            anchor's best class (int64).
        boxes: (B, 4, K) float32, contiguous. top_classes: (B, K) int64. n_valid: (B,) int32.
        conf: the threshold, already rounded to ``sorted_scores``' dtype.
    """
    batch, _, n = view.shape
    k = boxes.shape[2]
    _topk_boxes_kernel[(batch,)](view, view.stride(0), view.stride(1), view.stride(2), order, sorted_scores, classes,
                                 boxes, top_classes, n_valid, n, k, conf, BLOCK=min(_BLOCK, triton.next_power_of_2(k)),
                                 enable_fp_fusion=False)


@triton.jit
def _gather_detections_kernel(keep_ptr, count_ptr, boxes_ptr, sorted_ptr, topcls_ptr, dets_ptr, N, K, M,
                              BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    count = tl.load(count_ptr + b)
    for start in range(0, M, BLOCK):
        r = start + tl.arange(0, BLOCK)
        rows = r < M
        kept = rows & (r < count)
        j = tl.load(keep_ptr + b * M + r, mask=kept, other=0)
        base = boxes_ptr + b * 4 * K + j
        out = dets_ptr + (b * M + r) * 6
        tl.store(out, tl.load(base, mask=kept, other=0.0), mask=rows)
        tl.store(out + 1, tl.load(base + K, mask=kept, other=0.0), mask=rows)
        tl.store(out + 2, tl.load(base + 2 * K, mask=kept, other=0.0), mask=rows)
        tl.store(out + 3, tl.load(base + 3 * K, mask=kept, other=0.0), mask=rows)
        tl.store(out + 4, tl.load(sorted_ptr + b * N + j, mask=kept, other=0.0).to(tl.float32), mask=rows)
        tl.store(out + 5, tl.load(topcls_ptr + b * K + j, mask=kept, other=0).to(tl.float32), mask=rows)


def gather_detections(keep: Any, counts: Any, boxes: Any, sorted_scores: Any, top_classes: Any, dets: Any) -> None:
    """``dets[b, r]`` = (box, score, class) of candidate ``keep[b, r]`` for ``r < counts[b]``, zeros after.

    Args:
        keep: (B, max_det) int64 indices into the first K candidates (rows past the count are not read).
        counts: (B,) int32. boxes: (B, 4, K) float32. sorted_scores: (B, anchors). top_classes: (B, K) int64.
        dets: (B, max_det, 6) float32, contiguous.
    """
    batch, m = keep.shape
    _gather_detections_kernel[(batch,)](keep, counts, boxes, sorted_scores, top_classes, dets, sorted_scores.shape[1],
                                        boxes.shape[2], m, BLOCK=min(_BLOCK, triton.next_power_of_2(m)))
