"""A plan of a detector names its classes from the source model's metadata, with no labels file beside it."""

from __future__ import annotations

import shutil
from pathlib import Path

import streamrt
from streamrt.config import BuildConfig
from streamrt.video.model import bundled_model, open_detector


def test_plan_without_labels_file_uses_the_recorded_metadata(tmp_path: Path) -> None:
    onnx_copy = tmp_path / "det.onnx"
    shutil.copy(bundled_model(), onnx_copy)  # no det.txt next to it
    plan = streamrt.build(onnx_copy, BuildConfig(), tmp_path / "det.plan", cache=False).path
    detector = open_detector(plan)
    assert tuple(detector.names[:2]) == ("circle", "square")
