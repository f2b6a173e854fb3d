"""Detection post-processing on the host: decode, confidence threshold, top-k, class-aware greedy NMS.

Every implementation (this NumPy one, :mod:`streamrt.ops.postprocess_torch` on the device)
produces the same fixed-size result per image: ``max_det`` rows of ``x1, y1, x2, y2, score,
class`` in model-input pixels, best first, and the number of valid rows. Rows past the count are
zero. The semantics are those of ``torchvision.ops.batched_nms`` applied to the candidates, then
truncated to ``max_det``:

1. score of an anchor = its best class score (times objectness for YOLOv5 layouts);
2. keep anchors with ``score >= conf``; order them by descending score, ties by anchor index
   (a stable sort, as torchvision's ``nms`` does);
3. keep at most ``pre_nms_topk`` of them;
4. greedy NMS: walk that order and drop every later box of the *same class* whose IoU with a kept
   box is ``> iou`` (IoU computed in float32 as torchvision computes it; 0/0 is NaN and never
   suppresses, so zero-area boxes survive);
5. the first ``max_det`` kept boxes.

Steps 3 and 5 make the result equal to ``batched_nms(...)[:max_det]`` whenever fewer than
``pre_nms_topk`` anchors pass the threshold or the ``max_det``-th kept box lies within the top-k.

Example:
    >>> import numpy as np
    >>> raw = np.zeros((1, 4 + 2, 3), np.float32)      # yolov8 layout: 2 classes, 3 anchors
    >>> raw[0, :4] = [[50, 52, 200], [50, 50, 200], [20, 20, 30], [20, 20, 30]]
    >>> raw[0, 4:] = [[0.9, 0.8, 0.1], [0.0, 0.0, 0.7]]
    >>> post = CpuPostprocess(PostprocessConfig(conf=0.25, iou=0.5, max_det=10), "yolov8", 2)
    >>> dets, counts = np.empty((1, 10, 6), np.float32), np.empty(1, np.int32)
    >>> post(raw, dets, counts)[1].tolist()
    [2]
    >>> dets[0, :2, 4:].astype(np.float64).round(2).tolist()
    [[0.9, 0.0], [0.7, 1.0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamrt.errors import ConfigError, ShapeError
from streamrt.ops.layouts import LAYOUTS, OutputLayout

__all__ = ["CpuPostprocess", "PostprocessConfig", "decode_candidates", "nms_numpy"]


@dataclass(frozen=True)
class PostprocessConfig:
    """Thresholds and sizes of detection post-processing.

    Attributes:
        conf: minimum score of a candidate.
        iou: NMS IoU threshold (a box is dropped when IoU > iou with a kept box of its class).
        max_det: rows of the fixed-size output per image.
        pre_nms_topk: candidates (best scores) that enter NMS.
        class_agnostic: NMS across classes instead of per class.
    """

    conf: float = 0.25
    iou: float = 0.45
    max_det: int = 300
    pre_nms_topk: int = 1024
    class_agnostic: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.conf <= 1.0:
            raise ConfigError(f"conf must be in [0, 1], got {self.conf}")
        if not 0.0 <= self.iou <= 1.0:
            raise ConfigError(f"iou must be in [0, 1], got {self.iou}")
        for name in ("max_det", "pre_nms_topk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


def decode_candidates(
    raw: np.ndarray, layout: OutputLayout, num_classes: int, conf: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Candidates of one image's raw output ``(channels, anchors)`` (channels-first view).

    Returns:
        boxes ``(n, 4)`` float32 x1, y1, x2, y2; scores ``(n,)``; classes ``(n,)`` int64; anchor
        indices ``(n,)``: the anchors with ``score >= conf``, in anchor order.
    """
    start = layout.score_offset
    cls_scores = raw[start: start + num_classes]
    classes = cls_scores.argmax(0)
    scores = np.take_along_axis(cls_scores, classes[None], 0)[0].astype(np.float32)
    if layout.objectness:
        scores = scores * raw[4].astype(np.float32)
    anchors = np.flatnonzero(scores >= np.float32(conf))
    xywh = raw[:4, anchors].astype(np.float32)
    half_w, half_h = xywh[2] * np.float32(0.5), xywh[3] * np.float32(0.5)
    boxes = np.stack([xywh[0] - half_w, xywh[1] - half_h, xywh[0] + half_w, xywh[1] + half_h], 1)
    return boxes, scores[anchors], classes[anchors].astype(np.int64), anchors


def nms_numpy(
    boxes: np.ndarray, scores: np.ndarray, iou: float, classes: np.ndarray | None = None, max_det: int | None = None
) -> np.ndarray:
    """Greedy NMS with ``torchvision.ops.batched_nms`` semantics; returns kept indices, best first.

    Args:
        boxes: ``(n, 4)`` float32 x1, y1, x2, y2.
        scores: ``(n,)``; ties are broken by lower index (stable sort).
        iou: a box is dropped when its IoU with a kept box of the same class is ``> iou``.
        classes: ``(n,)`` class ids; None means one class (plain ``nms``).
        max_det: stop after this many kept boxes.
    """
    boxes = np.asarray(boxes, np.float32)
    order = np.argsort(-np.asarray(scores, np.float32), kind="stable")
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = (x2 - x1) * (y2 - y1)
    suppressed = np.zeros(len(boxes), bool)
    limit = len(boxes) if max_det is None else max_det
    threshold = np.float32(iou)
    keep: list[int] = []
    with np.errstate(invalid="ignore", divide="ignore"):
        for pos, i in enumerate(order):
            if suppressed[i]:
                continue
            keep.append(int(i))
            if len(keep) >= limit:
                break
            rest = order[pos + 1:]
            if classes is not None:
                rest = rest[classes[rest] == classes[i]]
            w = np.maximum(np.float32(0), np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]))
            h = np.maximum(np.float32(0), np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]))
            inter = w * h
            overlap = inter / (areas[i] + areas[rest] - inter)
            suppressed[rest[overlap > threshold]] = True
    return np.asarray(keep, np.int64)


class CpuPostprocess:
    """Decode + threshold + top-k + NMS of raw YOLO outputs on the host, into fixed-size outputs.

    Args:
        config: thresholds and sizes.
        layout: a name from :data:`~streamrt.ops.layouts.LAYOUTS` or an :class:`OutputLayout`.
        num_classes: class count of the model.
    """

    def __init__(self, config: PostprocessConfig, layout: str | OutputLayout, num_classes: int) -> None:
        self.config = config
        self.layout = LAYOUTS[layout] if isinstance(layout, str) else layout
        self.num_classes = num_classes

    def __call__(self, raw: np.ndarray, dets: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Post-process a raw batch into ``dets`` ``(batch, max_det, 6)`` and ``counts`` ``(batch,)``.

        Raises:
            ShapeError: ``raw`` does not have the layout's channel count, or the outputs are too small.
        """
        cfg, layout = self.config, self.layout
        raw = np.asarray(raw)
        view = layout.channels_first(raw)
        if raw.ndim != 3 or view.shape[1] != layout.channels(self.num_classes):
            raise ShapeError(f"raw output {raw.shape} is not {layout.expected(self.num_classes)}")
        if dets.shape[0] < raw.shape[0] or dets.shape[1:] != (cfg.max_det, 6) or counts.shape[0] < raw.shape[0]:
            raise ShapeError(f"outputs must be (>= {raw.shape[0]}, {cfg.max_det}, 6) and (>= {raw.shape[0]},), "
                             f"got {dets.shape} and {counts.shape}")
        for b in range(raw.shape[0]):
            boxes, scores, classes, _ = decode_candidates(view[b], layout, self.num_classes, cfg.conf)
            if len(scores) > cfg.pre_nms_topk:
                top = np.argsort(-scores, kind="stable")[: cfg.pre_nms_topk]
                top.sort()  # back to anchor order, so ties keep ordering by anchor index
                boxes, scores, classes = boxes[top], scores[top], classes[top]
            keep = nms_numpy(boxes, scores, cfg.iou, None if cfg.class_agnostic else classes, cfg.max_det)
            n = len(keep)
            dets[b].fill(0)
            dets[b, :n, :4] = boxes[keep]
            dets[b, :n, 4] = scores[keep]
            dets[b, :n, 5] = classes[keep]
            counts[b] = n
        return dets, counts
