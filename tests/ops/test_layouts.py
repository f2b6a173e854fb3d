"""YOLO output layouts: detection from shapes, hand-made tensors decoded correctly, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from streamrt.errors import ModelError
from streamrt.ops.layouts import LAYOUTS, resolve_layout
from streamrt.ops.postprocess import CpuPostprocess, PostprocessConfig, decode_candidates


@pytest.mark.parametrize(
    ("shape", "classes", "name", "found"),
    [((1, 84, 8400), None, "yolov8", 80), ((1, 25200, 85), None, "yolov5", 80), ((4, 9, 2100), 5, "yolov8", 5),
     ((1, 2100, 10), 5, "yolov5", 5), ((1, 2100, 9), 5, "yolov8t", 5), ((1, 6, 3), 2, "yolov8", 2)],
)
def test_layout_from_shape(shape: tuple[int, ...], classes: int | None, name: str, found: int) -> None:
    layout, n = resolve_layout(shape, num_classes=classes)
    assert (layout.name, n) == (name, found)


def test_forced_layout() -> None:
    layout, n = resolve_layout((1, 8400, 84), layout="yolov8t")
    assert (layout.name, n) == ("yolov8t", 80)


@pytest.mark.parametrize(
    ("shape", "classes", "match"),
    [((1, 1000), None, "3-D YOLO output"), ((1, 3, 80, 80), None, "3-D"), ((1, 84, 8400), 5, "fits no known"),
     ((1, 4, 8400), None, "fits no known"), ((1, 8400, 90), 80, "fits no known")],
)
def test_unexpected_layouts_are_clear_errors(shape: tuple[int, ...], classes: int | None, match: str) -> None:
    with pytest.raises(ModelError, match=match) as info:
        resolve_layout(shape, num_classes=classes)
    assert "yolov8" in str(info.value)  # the message says what was expected


def test_unknown_layout_name() -> None:
    with pytest.raises(ModelError, match="unknown output layout"):
        resolve_layout((1, 84, 8400), layout="ssd")


def _v8(boxes_xywh: list[list[float]], scores: list[list[float]]) -> np.ndarray:
    """(1, 4 + C, N) from per-anchor boxes and per-anchor class scores."""
    return np.concatenate([np.asarray(boxes_xywh, np.float32).T, np.asarray(scores, np.float32).T])[None]


def test_yolov8_hand_made_tensor() -> None:
    raw = _v8([[100, 50, 20, 10], [10, 10, 4, 4], [300, 200, 60, 40]], [[0.1, 0.9], [0.2, 0.1], [0.7, 0.3]])
    boxes, scores, classes, anchors = decode_candidates(raw[0], LAYOUTS["yolov8"], 2, conf=0.25)
    assert anchors.tolist() == [0, 2]
    np.testing.assert_allclose(boxes, [[90, 45, 110, 55], [270, 180, 330, 220]])
    np.testing.assert_allclose(scores, [0.9, 0.7], rtol=1e-6)
    assert classes.tolist() == [1, 0]


def test_yolov5_hand_made_tensor_multiplies_objectness() -> None:
    # (1, N, 5 + C): cx, cy, w, h, objectness, class scores
    raw = np.array([[[100, 50, 20, 10, 0.5, 0.1, 0.9], [10, 10, 4, 4, 0.9, 0.2, 0.1],
                     [300, 200, 60, 40, 1.0, 0.7, 0.3]]], np.float32)
    layout, n = resolve_layout(raw.shape, num_classes=2)
    assert layout.name == "yolov5"
    view = layout.channels_first(raw)
    boxes, scores, classes, anchors = decode_candidates(view[0], layout, n, conf=0.25)
    assert anchors.tolist() == [0, 2]
    np.testing.assert_allclose(scores, [0.45, 0.7], rtol=1e-6)
    assert classes.tolist() == [1, 0]
    np.testing.assert_allclose(boxes[0], [90, 45, 110, 55])


def test_the_same_detections_through_both_layouts() -> None:
    rng = np.random.default_rng(0)
    n, c = 300, 4
    v8 = np.concatenate([rng.uniform(20, 300, (2, n)), rng.uniform(5, 60, (2, n)), rng.random((c, n))]).astype(
        np.float32)[None]
    v5 = np.concatenate([v8[0, :4], np.ones((1, n), np.float32), v8[0, 4:]]).T[None].copy()
    cfg = PostprocessConfig(conf=0.3, iou=0.5, max_det=50)
    out = []
    for layout, raw in (("yolov8", v8), ("yolov5", v5), ("yolov8t", v8.transpose(0, 2, 1).copy())):
        dets, counts = np.empty((1, 50, 6), np.float32), np.empty(1, np.int32)
        CpuPostprocess(cfg, layout, c)(raw, dets, counts)
        out.append((dets.copy(), counts.copy()))
    for dets, counts in out[1:]:
        assert counts[0] == out[0][1][0] > 0
        np.testing.assert_array_equal(dets, out[0][0])
