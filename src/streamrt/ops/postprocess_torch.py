"""Detection post-processing on the device, with fixed-size outputs and no host synchronisation.

Same semantics as :mod:`streamrt.ops.postprocess` (read its docstring): raw YOLO output in,
``(batch, max_det, 6)`` detections and ``(batch,)`` counts out. Steps, all enqueued on the
current stream:

1. best class score per anchor (``torch.max``; times objectness for YOLOv5), scores below
   ``conf`` set to -1;
2. a stable descending sort of the scores, the first ``K = pre_nms_topk`` anchors gathered as
   x1/y1/x2/y2 boxes and classes, and the count of those above ``conf``;
3. NMS over these K: with Triton, a bitmask kernel (bit j of row i: box j later than i, same class,
   IoU > iou) and a greedy scan kernel that keeps the first ``max_det`` boxes; without Triton,
   a K x K mask and the Cluster-NMS fixed-point iteration (which reaches exactly the greedy
   result, but checks convergence on the host: use it on CPU tensors or as a fallback);
4. kept rows gathered into the output; rows past the count are zero.

With Triton the gathers and the box decode of step 2 and all of step 4 are one kernel each
(:mod:`streamrt.ops.triton_postprocess`), and so is step 1: 6 launches per call instead of ~25, which is what a frame
pays on the host when the stage is not replayed from a CUDA graph. They are on by default since they passed the
device ops' GPU tests (H100, 2026-12-06: 1.16x the torch steps in the synchronous loop, 1.31x in the streams
pipeline); ``STREAMRT_FUSED_POSTPROCESS=0`` keeps steps 1, 2 and 4 in torch (the detection benchmark's A/B).

Every buffer is allocated once in ``__init__`` for the engine's batch and anchor count, so a
stage made of this op can be captured in a CUDA graph and, replayed, copies back only the
``max_det`` x 6 result and the counts, never the raw ``(4 + C) x anchors`` tensor.

Example:
    >>> import torch
    >>> post = TorchPostprocess(PostprocessConfig(max_det=5), "yolov8", num_classes=2, anchors=3, device="cpu")
    >>> raw = torch.tensor([[[50., 52, 200], [50, 50, 200], [20, 20, 30], [20, 20, 30],
    ...                      [.9, .8, .1], [0, 0, .7]]])
    >>> dets, counts = torch.empty(1, 5, 6), torch.empty(1, dtype=torch.int32)
    >>> post(raw, dets, counts)
    >>> counts.tolist(), dets[0, :2, 5].tolist()
    ([2], [0.0, 1.0])
"""

from __future__ import annotations

from typing import Any

import torch

from streamrt._env import env_switch
from streamrt.errors import ShapeError
from streamrt.ops._backend import use_triton as resolve_triton
from streamrt.ops.layouts import LAYOUTS, OutputLayout
from streamrt.ops.postprocess import PostprocessConfig

__all__ = ["FUSED_ENV", "TorchPostprocess"]

FUSED_ENV = "STREAMRT_FUSED_POSTPROCESS"
"""``0``: steps 1, 2 and 4 as torch operations instead of the fused Triton kernels (read when the op is made; the
fused kernels are the default wherever Triton runs)."""


class TorchPostprocess:
    """Decode + threshold + top-k + class-aware NMS into fixed-size device outputs.

    Args:
        config: thresholds and sizes.
        layout: a name from :data:`~streamrt.ops.layouts.LAYOUTS` or an :class:`OutputLayout`.
        num_classes: class count of the model.
        anchors: anchors per image in the raw output (e.g. 8400 for a 640 YOLOv8).
        batch: the most images per call.
        device: where the raw outputs live.
        dtype: dtype of the raw outputs (an fp16 engine gives float16); boxes are decoded in float32.
        use_triton: None picks the Triton kernels wherever they can run.
    """

    def __init__(self, config: PostprocessConfig, layout: str | OutputLayout, num_classes: int, anchors: int, *,
                 batch: int = 1, device: Any = "cuda", dtype: torch.dtype = torch.float32,
                 use_triton: bool | None = None) -> None:
        self.config = config
        self.layout = LAYOUTS[layout] if isinstance(layout, str) else layout
        self.num_classes = num_classes
        self.anchors = anchors
        self.batch = batch
        self.device = torch.device(device)
        self.dtype = dtype
        self.use_triton = resolve_triton(self.device, use_triton)
        self.fused = env_switch(FUSED_ENV, True) and self.use_triton  # read (and checked) wherever the op is made
        # the threshold as torch compares it with a tensor of the scores' dtype (a half tensor vs a Python float:
        # in half), for the fused kernels, which compare in float32
        self._conf = float(torch.tensor(config.conf, dtype=dtype))
        self.k = min(config.pre_nms_topk, anchors)
        self.words = (self.k + 63) // 64
        b, n, k, m, dev = batch, anchors, self.k, config.max_det, self.device
        f32, i64 = torch.float32, torch.int64
        self._buf = {
            "scores": torch.empty((b, n), dtype=dtype, device=dev),
            "classes": torch.empty((b, n), dtype=i64, device=dev),
            "sorted": torch.empty((b, n), dtype=dtype, device=dev),
            "order": torch.empty((b, n), dtype=i64, device=dev),
            "boxes_in": torch.empty((b, 4, k), dtype=dtype, device=dev),
            "boxes_raw": torch.empty((b, 4, k), dtype=f32, device=dev),
            "boxes": torch.empty((b, 4, k), dtype=f32, device=dev),
            "top_classes": torch.empty((b, k), dtype=i64, device=dev),
            "n_valid": torch.empty((b,), dtype=torch.int32, device=dev),
            "keep": torch.empty((b, m), dtype=i64, device=dev),
            "kept_boxes": torch.empty((b, 4, m), dtype=f32, device=dev),
            "kept_scores": torch.empty((b, m), dtype=dtype, device=dev),
            "kept_classes": torch.empty((b, m), dtype=i64, device=dev),
            "rows": torch.arange(m, device=dev, dtype=torch.int32).view(1, m),
        }
        if self.use_triton:
            self._buf["mask"] = torch.empty((b, k, self.words), dtype=i64, device=dev)

    def __call__(self, raw: torch.Tensor, dets: torch.Tensor, counts: torch.Tensor) -> None:
        """Post-process ``raw`` (batch, ., .) into ``dets`` (batch, max_det, 6) float32 and ``counts`` (batch,) int32.

        Raises:
            ShapeError: ``raw`` does not have the layout's shape, or the outputs are the wrong size.
        """
        cfg, layout = self.config, self.layout
        view = layout.channels_first(raw)
        b = raw.shape[0]
        if raw.dim() != 3 or tuple(view.shape[1:]) != (layout.channels(self.num_classes), self.anchors):
            raise ShapeError(f"raw output {tuple(raw.shape)} is not {layout.expected(self.num_classes)} with "
                             f"{self.anchors} anchors")
        if raw.dtype != self.dtype:
            raise ShapeError(f"raw output is {raw.dtype}, the op was made for {self.dtype}")
        if (b > self.batch or tuple(dets.shape) != (b, cfg.max_det, 6) or tuple(counts.shape) != (b,)
                or counts.dtype != torch.int32):
            raise ShapeError(f"outputs must be ({b}, {cfg.max_det}, 6) and int32 ({b},) for a batch of {b} "
                             f"(op sized for {self.batch}), got {tuple(dets.shape)} and {tuple(counts.shape)}")
        with torch.no_grad():
            if self.fused:
                self._candidates_triton(view, b)
                self._nms_triton(b, counts)
                self._gather_triton(b, dets, counts)
                return
            self._candidates(view, b)
            if self.use_triton:
                self._buf["keep"][:b].zero_()  # the torch gather reads every row
                self._nms_triton(b, counts)
            else:
                self._nms_torch(b, counts)
            self._gather(b, dets, counts)

    def _scores(self, view: torch.Tensor, b: int) -> None:
        """Best class score per anchor (times objectness), below ``conf`` set to -1, sorted descending."""
        buf, conf = self._buf, self.config.conf
        start = self.layout.score_offset
        scores, classes = buf["scores"][:b], buf["classes"][:b]
        torch.max(view[:, start: start + self.num_classes], dim=1, out=(scores, classes))
        if self.layout.objectness:
            scores.mul_(view[:, 4])
        scores.masked_fill_(scores < conf, -1.0)
        torch.sort(scores, dim=1, descending=True, stable=True, out=(buf["sorted"][:b], buf["order"][:b]))

    def _candidates_triton(self, view: torch.Tensor, b: int) -> None:
        from streamrt.ops import triton_postprocess

        buf = self._buf
        scores, classes = buf["scores"][:b], buf["classes"][:b]
        triton_postprocess.best_scores(view, scores, classes, self.layout.score_offset, self.num_classes,
                                       self.layout.objectness, self._conf)
        torch.sort(scores, dim=1, descending=True, stable=True, out=(buf["sorted"][:b], buf["order"][:b]))
        triton_postprocess.topk_boxes(view[:, :4], buf["order"][:b], buf["sorted"][:b], classes,
                                      buf["boxes"][:b], buf["top_classes"][:b], buf["n_valid"][:b], self._conf)

    def _gather_triton(self, b: int, dets: torch.Tensor, counts: torch.Tensor) -> None:
        if not dets.is_contiguous():  # the kernel writes rows of 6 floats; torch's gather reads every keep row
            self._buf["keep"][:b].masked_fill_(self._buf["rows"] >= counts[:, None], 0)
            self._gather(b, dets, counts)
            return
        from streamrt.ops import triton_postprocess

        buf = self._buf
        triton_postprocess.gather_detections(buf["keep"][:b], counts, buf["boxes"][:b], buf["sorted"][:b],
                                             buf["top_classes"][:b], dets)

    def _candidates(self, view: torch.Tensor, b: int) -> None:
        buf, k, conf = self._buf, self.k, self.config.conf
        classes = buf["classes"][:b]
        self._scores(view, b)
        top = buf["order"][:b, :k]
        raw_boxes, boxes = buf["boxes_raw"][:b], buf["boxes"][:b]
        if self.dtype == torch.float32:
            torch.gather(view[:, :4], 2, top.unsqueeze(1).expand(b, 4, k), out=raw_boxes)
        else:  # gather in the engine's dtype, decode in float32
            torch.gather(view[:, :4], 2, top.unsqueeze(1).expand(b, 4, k), out=buf["boxes_in"][:b])
            raw_boxes.copy_(buf["boxes_in"][:b])
        cx, cy, w, h = raw_boxes.unbind(1)
        torch.sub(cx, w, alpha=0.5, out=boxes[:, 0])
        torch.sub(cy, h, alpha=0.5, out=boxes[:, 1])
        torch.add(cx, w, alpha=0.5, out=boxes[:, 2])
        torch.add(cy, h, alpha=0.5, out=boxes[:, 3])
        torch.gather(classes, 1, top, out=buf["top_classes"][:b])
        torch.sum(buf["sorted"][:b, :k] >= conf, dim=1, dtype=torch.int32, out=buf["n_valid"][:b])

    def _nms_triton(self, b: int, counts: torch.Tensor) -> None:
        from streamrt.ops import triton_kernels

        buf = self._buf
        keep = buf["keep"][:b]  # rows past the count keep what they held (the caller clears them if it reads them)
        triton_kernels.nms_mask(buf["boxes"][:b], buf["top_classes"][:b], buf["mask"][:b], self.config.iou,
                                self.config.class_agnostic)
        triton_kernels.nms_scan(buf["mask"][:b], buf["n_valid"][:b], keep, counts)

    def _nms_torch(self, b: int, counts: torch.Tensor) -> None:
        """Cluster-NMS: keep_j = no earlier kept box suppresses j, iterated to its fixed point.

        The fixed point is unique and equals greedy NMS; each pass fixes at least one more box
        in score order, so it takes at most K passes (a handful on real detections).
        """
        buf, k, m = self._buf, self.k, self.config.max_det
        boxes = buf["boxes"][:b].transpose(1, 2)  # (b, k, 4)
        area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
        lt = torch.maximum(boxes[:, :, None, :2], boxes[:, None, :, :2])
        rb = torch.minimum(boxes[:, :, None, 2:], boxes[:, None, :, 2:])
        wh = (rb - lt).clamp(min=0)
        inter = wh[..., 0] * wh[..., 1]
        iou = inter / (area[:, :, None] + area[:, None, :] - inter)
        index = torch.arange(k, device=self.device)
        valid = index[None, :] < buf["n_valid"][:b, None]
        hits = (iou > self.config.iou) & (index[None, :, None] < index[None, None, :]) & valid[:, None, :]
        if not self.config.class_agnostic:
            cls = buf["top_classes"][:b]
            hits &= cls[:, :, None] == cls[:, None, :]
        keep = valid.clone()
        for _ in range(k):
            suppressed = (hits & keep[:, :, None]).any(1)
            new = valid & ~suppressed
            if torch.equal(new, keep):
                break
            keep = new
        position = keep.cumsum(1) - 1
        slots = torch.where(keep & (position < m), position, m)
        full = torch.zeros((b, m + 1), dtype=torch.int64, device=self.device)
        full.scatter_(1, slots, index.expand(b, k).contiguous())
        buf["keep"][:b].copy_(full[:, :m])
        counts.copy_(keep.sum(1).clamp(max=m))

    def _gather(self, b: int, dets: torch.Tensor, counts: torch.Tensor) -> None:
        buf, m = self._buf, self.config.max_det
        keep = buf["keep"][:b]
        kept_boxes = buf["kept_boxes"][:b]
        torch.gather(buf["boxes"][:b], 2, keep.unsqueeze(1).expand(b, 4, m), out=kept_boxes)
        torch.gather(buf["sorted"][:b], 1, keep, out=buf["kept_scores"][:b])
        torch.gather(buf["top_classes"][:b], 1, keep, out=buf["kept_classes"][:b])
        dets[..., :4].copy_(kept_boxes.transpose(1, 2))
        dets[..., 4].copy_(buf["kept_scores"][:b])
        dets[..., 5].copy_(buf["kept_classes"][:b])
        dets.masked_fill_((buf["rows"] >= counts[:, None]).unsqueeze(2), 0.0)
