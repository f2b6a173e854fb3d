"""A batch's detections split per frame and mapped to frame pixels at once equal the per-frame mapping."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from streamrt.ops.letterbox import LetterboxGeometry
from streamrt.video.workload import split_detections


def test_each_frame_gets_its_own_rows_mapped_as_one_frame_at_a_time_would() -> None:
    rng = np.random.default_rng(7)
    geometry = LetterboxGeometry.fit((1080, 1920), (640, 640))
    dets = (rng.random((5, 50, 6)) * 700 - 30).astype(np.float32)  # some boxes outside the picture: clipped
    dets[..., 5] = rng.integers(0, 80, (5, 50))
    counts = np.array([0, 3, 50, 1, 7, 9], dtype=np.int32)[:5]  # an empty frame and a full one
    frames = [SimpleNamespace(source=10 + b, index=100 + b, captured=0.5 * b) for b in range(4)]  # batch of 4 of 5
    before = dets.copy()

    got = split_detections(frames, dets, counts, geometry)

    assert [(d.source, d.index, d.captured, len(d)) for d in got] == [
        (10, 100, 0.0, 0), (11, 101, 0.5, 3), (12, 102, 1.0, 50), (13, 103, 1.5, 1)]
    for b, d in enumerate(got):
        one = dets[b, : counts[b]].copy()
        geometry.to_source(one[:, :4])
        np.testing.assert_array_equal(d.boxes, one[:, :4])
        np.testing.assert_array_equal(d.scores, one[:, 4])
        assert d.classes.dtype == np.int64 and np.array_equal(d.classes, one[:, 5].astype(np.int64))
        assert (d.boxes[:, 0::2] <= 1920).all() and (d.boxes >= 0).all()
    np.testing.assert_array_equal(dets, before)  # the slot's host buffer is left as it was (reused next batch)


def test_no_frame_and_no_detection_split_to_nothing() -> None:
    geometry = LetterboxGeometry.fit((480, 640), (320, 320))
    dets = np.zeros((2, 10, 6), np.float32)
    assert split_detections([], dets, np.zeros(2, np.int32), geometry) == []
    frames = [SimpleNamespace(source=0, index=0, captured=0.0)] * 2
    got = split_detections(frames, dets, np.zeros(2, np.int32), geometry)
    assert [len(d) for d in got] == [0, 0] and got[0].boxes.shape == (0, 4)
