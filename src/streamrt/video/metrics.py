"""Detection accuracy: box IoU, greedy matching and mean average precision at an IoU threshold.

AP per class is the area under the precision envelope sampled at 101 recall points (the COCO
and Ultralytics convention); mAP averages it over the classes that have ground truth.

Example:
    >>> import numpy as np
    >>> truth = [(np.array([[0, 0, 10, 10]], np.float32), np.array([0]))]
    >>> preds = [(np.array([[1, 0, 10, 10], [50, 50, 60, 60]], np.float32), np.array([0.9, 0.8]), np.array([0, 0]))]
    >>> round(mean_average_precision(preds, truth, num_classes=1).map, 3)
    1.0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["MapResult", "box_iou", "match_detections", "mean_average_precision"]

Prediction = tuple[np.ndarray, np.ndarray, np.ndarray]  # boxes (n, 4), scores (n,), classes (n,)
Truth = tuple[np.ndarray, np.ndarray]  # boxes (m, 4), classes (m,)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix ``(len(a), len(b))`` of x1, y1, x2, y2 boxes."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), 2)
    area_a = np.prod(a[:, 2:] - a[:, :2], 1)
    area_b = np.prod(b[:, 2:] - b[:, :2], 1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def match_detections(pred: Prediction, truth: Truth, iou: float = 0.5) -> np.ndarray:
    """Which predictions are true positives: greedy by score, each truth matched once, same class.

    Returns a boolean array in the predictions' order.
    """
    boxes, scores, classes = pred
    gt_boxes, gt_classes = truth
    tp = np.zeros(len(scores), bool)
    if len(scores) == 0 or len(gt_classes) == 0:
        return tp
    overlaps = box_iou(boxes, gt_boxes)
    overlaps[np.asarray(classes)[:, None] != np.asarray(gt_classes)[None, :]] = 0
    taken = np.zeros(len(gt_classes), bool)
    for i in np.argsort(-np.asarray(scores), kind="stable"):
        candidates = np.where(taken, -1.0, overlaps[i])
        j = int(np.argmax(candidates))
        if candidates[j] >= iou:
            tp[i] = True
            taken[j] = True
    return tp


def _average_precision(tp: np.ndarray, scores: np.ndarray, positives: int) -> float:
    if positives == 0:
        return float("nan")
    if len(tp) == 0:
        return 0.0
    order = np.argsort(-scores, kind="stable")
    hits = np.cumsum(tp[order])
    recall = hits / positives
    precision = hits / np.arange(1, len(hits) + 1)
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    points = np.linspace(0, 1, 101)
    index = np.searchsorted(recall, points, side="left")
    sampled = np.where(index < len(envelope), envelope[np.minimum(index, len(envelope) - 1)], 0.0)
    return float(sampled.mean())


@dataclass(frozen=True)
class MapResult:
    """mAP at one IoU threshold, AP per class (NaN for classes without ground truth), counts."""

    map: float
    per_class: dict[int, float] = field(default_factory=dict)
    truths: int = 0
    predictions: int = 0
    recall: float = 0.0


def mean_average_precision(
    predictions: Sequence[Prediction], truths: Sequence[Truth], num_classes: int, iou: float = 0.5
) -> MapResult:
    """mAP@``iou`` over images: ``predictions[i]`` and ``truths[i]`` belong to image ``i``."""
    tps, scores, classes = [], [], []
    positives = np.zeros(num_classes, np.int64)
    for pred, truth in zip(predictions, truths, strict=True):
        tps.append(match_detections(pred, truth, iou))
        scores.append(np.asarray(pred[1], np.float64))
        classes.append(np.asarray(pred[2], np.int64))
        positives += np.bincount(np.asarray(truth[1], np.int64), minlength=num_classes)[:num_classes]
    tp = np.concatenate(tps) if tps else np.zeros(0, bool)
    score = np.concatenate(scores) if scores else np.zeros(0)
    cls = np.concatenate(classes) if classes else np.zeros(0, np.int64)
    per_class = {c: _average_precision(tp[cls == c], score[cls == c], int(positives[c])) for c in range(num_classes)}
    valid = [ap for ap in per_class.values() if not np.isnan(ap)]
    total = int(positives.sum())
    return MapResult(
        map=float(np.mean(valid)) if valid else float("nan"),
        per_class=per_class,
        truths=total,
        predictions=len(tp),
        recall=float(tp.sum() / total) if total else float("nan"),
    )
