"""The synthetic data generator (deterministic, exact ground truth) and the mAP metric."""

from __future__ import annotations

import numpy as np
import pytest

from streamrt.video.metrics import box_iou, match_detections, mean_average_precision
from streamrt.video.synthetic import CLASS_NAMES, SceneConfig, SyntheticClip, random_scene

pytest.importorskip("cv2")


def test_scenes_are_deterministic_and_boxes_are_inside() -> None:
    a, ta = random_scene(np.random.default_rng(4), 180, 320, SceneConfig(max_objects=6))
    b, tb = random_scene(np.random.default_rng(4), 180, 320, SceneConfig(max_objects=6))
    assert np.array_equal(a, b) and np.array_equal(ta.boxes, tb.boxes)
    assert len(ta) >= 1 and ta.classes.max() < len(CLASS_NAMES)
    assert (ta.boxes[:, :2] >= 0).all() and (ta.boxes[:, 2] <= 320).all() and (ta.boxes[:, 3] <= 180).all()
    assert (ta.boxes[:, 2:] > ta.boxes[:, :2]).all()


def test_objects_are_drawn_inside_their_boxes() -> None:
    clip = SyntheticClip(width=320, height=180, frames=4, seed=9, objects=3)
    frame, truth = clip.frame(3), clip.ground_truth(3)
    background = SyntheticClip(width=320, height=180, frames=4, seed=9, objects=0).frame(3)
    changed = np.abs(frame.astype(int) - background.astype(int)).sum(2) > 30
    inside = np.zeros_like(changed)
    for x1, y1, x2, y2 in truth.boxes:  # anti-aliasing may touch the pixel next to a box edge
        inside[max(int(y1) - 2, 0): int(np.ceil(y2)) + 2, max(int(x1) - 2, 0): int(np.ceil(x2)) + 2] = True
    assert changed.any() and not (changed & ~inside).any()


def test_clip_ground_truth_moves_and_stays_in_frame() -> None:
    clip = SyntheticClip(width=200, height=100, frames=300, seed=2)
    boxes = np.stack([clip.ground_truth(i).boxes for i in range(0, 300, 50)])
    assert not np.allclose(boxes[0], boxes[-1])
    assert boxes.min() >= 0 and boxes[..., 2].max() <= 200 and boxes[..., 3].max() <= 100


def test_box_iou_and_matching() -> None:
    iou = box_iou(np.array([[0, 0, 10, 10]]), np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]]))
    np.testing.assert_allclose(iou, [[1.0, 1 / 3, 0.0]])
    pred = (np.array([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10]], np.float32), np.array([0.9, 0.8, 0.7]),
            np.array([0, 0, 1]))
    truth = (np.array([[0, 0, 10, 10]], np.float32), np.array([0]))
    assert match_detections(pred, truth).tolist() == [True, False, False]  # one match per truth, class-aware


def test_map_of_perfect_and_useless_predictions() -> None:
    truths = [(np.array([[0, 0, 10, 10], [20, 20, 40, 40]], np.float32), np.array([0, 1]))]
    perfect = [(truths[0][0], np.array([0.9, 0.8]), truths[0][1])]
    assert mean_average_precision(perfect, truths, 2).map == pytest.approx(1.0)
    wrong_class = [(truths[0][0], np.array([0.9, 0.8]), np.array([1, 0]))]
    assert mean_average_precision(wrong_class, truths, 2).map == pytest.approx(0.0)
    half = [(truths[0][0][:1], np.array([0.9]), np.array([0]))]
    result = mean_average_precision(half, truths, 2)
    assert result.per_class[0] == pytest.approx(1.0) and result.per_class[1] == 0.0 and result.recall == 0.5
