"""Triton kernels of the device ops: one-pass letterbox, NMS IoU bitmask, and the greedy NMS scan.

Imported only when Triton is (``streamrt.ops._backend.use_triton``). The kernels run on the
current torch stream, never synchronise with the host and launch with fixed grids, so a stage
made of them can be captured in a CUDA graph.

* :func:`letterbox` reads uint8 HWC frames and writes the normalised CHW input in one pass: each
  output pixel is bilinear (half-pixel centres, clamped borders), channel-swapped and
  normalised, or the padding value.
* :func:`nv12_letterbox` does the same from NV12 pictures (a hardware decoder's output): each of
  the four source pixels is converted YUV -> RGB (limited range, BT.601 or BT.709, nearest
  chroma) before the interpolation, so decode -> model input is one kernel and RGB frames never
  exist in memory. :class:`streamrt.ops.nv12.CpuNv12Letterbox` is its reference.
* :func:`nms_mask` computes, for the top-``K`` candidates sorted by score, bit ``j % 64`` of word
  ``j // 64`` of row ``i``: "box ``j > i`` has IoU ``> thr`` with box ``i`` (and the same class)".
  Words left of the diagonal block are written as zero and never read.
* :func:`nms_scan` walks the boxes in score order in a single program per image, keeping a box
  when no kept box's row has set its bit, and stops keeping at ``max_det``: the exact greedy
  NMS. Its loop is sequential by nature (greedy NMS is), but it only reads a row for boxes it
  keeps and skips whole words of suppressed boxes.

The same arithmetic as ``torchvision.ops.nms`` (float32, ``inter / (area_a + area_b - inter) >
thr``), so the results match it. Tested on the CPU with ``TRITON_INTERPRET=1``; see
``tests/ops/test_triton_interpret.py``.
"""

# Kernel parameters stay unannotated: Triton reads annotations as specialisation hints.
# mypy: disable-error-code="no-untyped-def,attr-defined"

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

__all__ = ["letterbox", "nms_mask", "nms_scan", "nv12_letterbox"]

_LETTERBOX_BLOCK = 512
_MASK_ROWS = 32


@triton.jit
def _letterbox_kernel(src_ptr, dst_ptr, src_h, src_w, src_batch_stride, new_h, new_w, top, left, out_h, out_w,
                      dst_batch_stride, ratio_y, ratio_x,
                      ch0, ch1, ch2, scale0, scale1, scale2, shift0, shift1, shift2, pad0, pad1, pad2,
                      BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    valid = offs < out_h * out_w
    oy = offs // out_w
    ox = offs % out_w
    ry = oy - top
    rx = ox - left
    inside = valid & (ry >= 0) & (ry < new_h) & (rx >= 0) & (rx < new_w)
    sy = tl.maximum((ry.to(tl.float32) + 0.5) * ratio_y - 0.5, 0.0)
    sx = tl.maximum((rx.to(tl.float32) + 0.5) * ratio_x - 0.5, 0.0)
    y0 = tl.minimum(sy.to(tl.int32), src_h - 1)  # sy >= 0, so truncation is floor
    x0 = tl.minimum(sx.to(tl.int32), src_w - 1)
    fy = tl.where(y0 >= src_h - 1, 0.0, sy - y0.to(tl.float32))
    fx = tl.where(x0 >= src_w - 1, 0.0, sx - x0.to(tl.float32))
    y1 = tl.minimum(y0 + 1, src_h - 1)
    x1 = tl.minimum(x0 + 1, src_w - 1)
    base = src_ptr + b * src_batch_stride
    p00 = base + (y0.to(tl.int64) * src_w + x0) * 3
    p01 = base + (y0.to(tl.int64) * src_w + x1) * 3
    p10 = base + (y1.to(tl.int64) * src_w + x0) * 3
    p11 = base + (y1.to(tl.int64) * src_w + x1) * 3
    out = dst_ptr + b * dst_batch_stride + offs
    plane = out_h * out_w
    _letterbox_channel(p00 + ch0, p01 + ch0, p10 + ch0, p11 + ch0, fx, fy, scale0, shift0, pad0, inside, valid, out)
    _letterbox_channel(p00 + ch1, p01 + ch1, p10 + ch1, p11 + ch1, fx, fy, scale1, shift1, pad1, inside, valid,
                       out + plane)
    _letterbox_channel(p00 + ch2, p01 + ch2, p10 + ch2, p11 + ch2, fx, fy, scale2, shift2, pad2, inside, valid,
                       out + 2 * plane)


@triton.jit
def _letterbox_channel(p00, p01, p10, p11, fx, fy, scale, shift, pad, inside, valid, out):
    v00 = tl.load(p00, mask=inside, other=0).to(tl.float32)
    v01 = tl.load(p01, mask=inside, other=0).to(tl.float32)
    v10 = tl.load(p10, mask=inside, other=0).to(tl.float32)
    v11 = tl.load(p11, mask=inside, other=0).to(tl.float32)
    upper = v00 + (v01 - v00) * fx
    lower = v10 + (v11 - v10) * fx
    value = (upper + (lower - upper) * fy) * scale + shift
    tl.store(out, tl.where(inside, value, pad).to(out.dtype.element_ty), mask=valid)


def letterbox(frames: Any, out: Any, geometry: Any, normalize: Any) -> None:
    """Letterbox ``frames`` (B, H, W, 3) uint8 into ``out`` (B, 3, h, w) on the current stream."""
    batch = frames.shape[0]
    g = geometry
    grid = (triton.cdiv(g.dst_h * g.dst_w, _LETTERBOX_BLOCK), batch)
    c0, c1, c2 = normalize.source_channel
    s0, s1, s2 = normalize.scale
    t0, t1, t2 = normalize.shift
    _letterbox_kernel[grid](
        frames, out, g.src_h, g.src_w, frames.stride(0), g.new_h, g.new_w, g.top, g.left, g.dst_h, g.dst_w,
        out.stride(0), g.src_h / g.new_h, g.src_w / g.new_w, c0, c1, c2, s0, s1, s2, t0, t1, t2,
        normalize.pad(0), normalize.pad(1), normalize.pad(2), BLOCK=_LETTERBOX_BLOCK,
    )


@triton.jit
def _nv12_pixel(base, pitch, uv_row0, y, x, ky, kvr, kug, kvg, kub, mask):
    """RGB (float, 0..255) of pixel (y, x) of an NV12 picture whose chroma plane starts at row ``uv_row0``."""
    luma = tl.load(base + y.to(tl.int64) * pitch + x, mask=mask, other=16).to(tl.float32) - 16.0
    chroma = base + (uv_row0 + y // 2).to(tl.int64) * pitch + (x // 2) * 2
    u = tl.load(chroma, mask=mask, other=128).to(tl.float32) - 128.0
    v = tl.load(chroma + 1, mask=mask, other=128).to(tl.float32) - 128.0
    yy = ky * luma
    r = tl.minimum(tl.maximum(yy + kvr * v, 0.0), 255.0)
    g = tl.minimum(tl.maximum(yy - kug * u - kvg * v, 0.0), 255.0)
    b = tl.minimum(tl.maximum(yy + kub * u, 0.0), 255.0)
    return r, g, b


@triton.jit
def _nv12_letterbox_kernel(src_ptr, dst_ptr, src_h, src_w, pitch, src_batch_stride, new_h, new_w, top, left,
                           out_h, out_w, dst_batch_stride, ratio_y, ratio_x, ky, kvr, kug, kvg, kub,
                           scale0, scale1, scale2, shift0, shift1, shift2, pad0, pad1, pad2,
                           RGB_OUT: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    valid = offs < out_h * out_w
    oy = offs // out_w
    ox = offs % out_w
    ry = oy - top
    rx = ox - left
    inside = valid & (ry >= 0) & (ry < new_h) & (rx >= 0) & (rx < new_w)
    sy = tl.maximum((ry.to(tl.float32) + 0.5) * ratio_y - 0.5, 0.0)
    sx = tl.maximum((rx.to(tl.float32) + 0.5) * ratio_x - 0.5, 0.0)
    y0 = tl.minimum(sy.to(tl.int32), src_h - 1)
    x0 = tl.minimum(sx.to(tl.int32), src_w - 1)
    fy = tl.where(y0 >= src_h - 1, 0.0, sy - y0.to(tl.float32))
    fx = tl.where(x0 >= src_w - 1, 0.0, sx - x0.to(tl.float32))
    y1 = tl.minimum(y0 + 1, src_h - 1)
    x1 = tl.minimum(x0 + 1, src_w - 1)
    base = src_ptr + b * src_batch_stride
    r00, g00, b00 = _nv12_pixel(base, pitch, src_h, y0, x0, ky, kvr, kug, kvg, kub, inside)
    r01, g01, b01 = _nv12_pixel(base, pitch, src_h, y0, x1, ky, kvr, kug, kvg, kub, inside)
    r10, g10, b10 = _nv12_pixel(base, pitch, src_h, y1, x0, ky, kvr, kug, kvg, kub, inside)
    r11, g11, b11 = _nv12_pixel(base, pitch, src_h, y1, x1, ky, kvr, kug, kvg, kub, inside)
    red = _lerp2(r00, r01, r10, r11, fx, fy)
    green = _lerp2(g00, g01, g10, g11, fx, fy)
    blue = _lerp2(b00, b01, b10, b11, fx, fy)
    first = red if RGB_OUT else blue
    last = blue if RGB_OUT else red
    out = dst_ptr + b * dst_batch_stride + offs
    plane = out_h * out_w
    ty = out.dtype.element_ty
    tl.store(out, tl.where(inside, first * scale0 + shift0, pad0).to(ty), mask=valid)
    tl.store(out + plane, tl.where(inside, green * scale1 + shift1, pad1).to(ty), mask=valid)
    tl.store(out + 2 * plane, tl.where(inside, last * scale2 + shift2, pad2).to(ty), mask=valid)


@triton.jit
def _lerp2(v00, v01, v10, v11, fx, fy):
    upper = v00 + (v01 - v00) * fx
    lower = v10 + (v11 - v10) * fx
    return upper + (lower - upper) * fy


def nv12_letterbox(frames: Any, out: Any, geometry: Any, normalize: Any, matrix: Any) -> None:
    """Letterbox NV12 ``frames`` (B, H * 3 / 2, W) uint8 (rows may be pitched) into ``out`` (B, 3, h, w)."""
    batch = frames.shape[0]
    g, m, n = geometry, matrix, normalize
    grid = (triton.cdiv(g.dst_h * g.dst_w, _LETTERBOX_BLOCK), batch)
    s0, s1, s2 = n.scale
    t0, t1, t2 = n.shift
    _nv12_letterbox_kernel[grid](
        frames, out, g.src_h, g.src_w, frames.stride(1), frames.stride(0), g.new_h, g.new_w, g.top, g.left,
        g.dst_h, g.dst_w, out.stride(0), g.src_h / g.new_h, g.src_w / g.new_w, m.ky, m.kvr, m.kug, m.kvg, m.kub,
        s0, s1, s2, t0, t1, t2, n.pad(0), n.pad(1), n.pad(2), RGB_OUT=bool(n.bgr_to_rgb), BLOCK=_LETTERBOX_BLOCK,
    )


@triton.jit
def _nms_mask_kernel(boxes_ptr, cls_ptr, mask_ptr, K, W, iou_thr, AGNOSTIC: tl.constexpr, ROWS: tl.constexpr):
    rb = tl.program_id(0)
    cw = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    rows = rb * ROWS + tl.arange(0, ROWS)
    rmask = rows < K
    out = mask_ptr + (b * K + rows) * W + cw
    if (cw + 1) * 64 > rb * ROWS:  # the word holds boxes after some row of this block
        cols = cw * 64 + tl.arange(0, 64)
        cmask = cols < K
        base = boxes_ptr + b * 4 * K
        rx1 = tl.load(base + rows, mask=rmask, other=0.0)
        ry1 = tl.load(base + K + rows, mask=rmask, other=0.0)
        rx2 = tl.load(base + 2 * K + rows, mask=rmask, other=0.0)
        ry2 = tl.load(base + 3 * K + rows, mask=rmask, other=0.0)
        cx1 = tl.load(base + cols, mask=cmask, other=0.0)
        cy1 = tl.load(base + K + cols, mask=cmask, other=0.0)
        cx2 = tl.load(base + 2 * K + cols, mask=cmask, other=0.0)
        cy2 = tl.load(base + 3 * K + cols, mask=cmask, other=0.0)
        r_area = (rx2 - rx1) * (ry2 - ry1)
        c_area = (cx2 - cx1) * (cy2 - cy1)
        w = tl.maximum(tl.minimum(rx2[:, None], cx2[None, :]) - tl.maximum(rx1[:, None], cx1[None, :]), 0.0)
        h = tl.maximum(tl.minimum(ry2[:, None], cy2[None, :]) - tl.maximum(ry1[:, None], cy1[None, :]), 0.0)
        inter = w * h
        iou = inter / (r_area[:, None] + c_area[None, :] - inter)
        hit = (iou > iou_thr) & (cols[None, :] > rows[:, None]) & cmask[None, :]
        if not AGNOSTIC:
            rc = tl.load(cls_ptr + b * K + rows, mask=rmask, other=-1)
            cc = tl.load(cls_ptr + b * K + cols, mask=cmask, other=-2)
            hit = hit & (rc[:, None] == cc[None, :])
        one = tl.full([1, 64], 1, tl.int64)
        bits = tl.where(hit, one << tl.arange(0, 64)[None, :].to(tl.int64), 0)
        tl.store(out, tl.sum(bits, axis=1), mask=rmask)  # distinct powers of two: the sum is the OR
    else:
        tl.store(out, tl.zeros([ROWS], tl.int64), mask=rmask)


def nms_mask(boxes: Any, classes: Any, mask: Any, iou: float, agnostic: bool) -> None:
    """Fill ``mask`` (B, K, W) int64 from ``boxes`` (B, 4, K) float32 x1/y1/x2/y2 and ``classes`` (B, K)."""
    batch, _, k = boxes.shape
    words = mask.shape[2]
    grid = (triton.cdiv(k, _MASK_ROWS), words, batch)
    # No fused multiply-adds: the IoU must round exactly as torchvision's and the host version's do.
    _nms_mask_kernel[grid](boxes, classes, mask, k, words, iou, AGNOSTIC=agnostic, ROWS=_MASK_ROWS,
                           enable_fp_fusion=False)


@triton.jit
def _nms_scan_kernel(mask_ptr, nvalid_ptr, keep_ptr, count_ptr, K, W, MAX_DET, BLOCK_W: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_W)
    removed = tl.zeros([BLOCK_W], dtype=tl.int64)
    n_valid = tl.load(nvalid_ptr + b)
    count = tl.zeros([], dtype=tl.int32)  # a scalar carried through the loops
    rows = mask_ptr + b * K * W
    for w in range(0, W):
        cur = tl.sum(tl.where(offs == w, removed, 0), axis=0)
        if (count < MAX_DET) & (w * 64 < n_valid):
            for k in range(0, 64):
                i = w * 64 + k
                if (((cur >> k) & 1) == 0) & (i < n_valid) & (count < MAX_DET):
                    tl.store(keep_ptr + b * MAX_DET + count, i.to(tl.int64))
                    count += 1
                    row = rows + i.to(tl.int64) * W
                    removed = removed | tl.load(row + offs, mask=offs < W, other=0)
                    cur = cur | tl.load(row + w)
    tl.store(count_ptr + b, count)


def nms_scan(mask: Any, n_valid: Any, keep: Any, counts: Any) -> None:
    """Greedy scan of ``mask`` (B, K, W): kept indices into ``keep`` (B, max_det) int64 (rest untouched),
    kept counts into ``counts`` (B,) int32. Only the first ``n_valid[b]`` boxes of image ``b`` count."""
    batch, k, words = mask.shape
    _nms_scan_kernel[(batch,)](mask, n_valid, keep, counts, k, words, keep.shape[1],
                               BLOCK_W=max(16, triton.next_power_of_2(words)))
