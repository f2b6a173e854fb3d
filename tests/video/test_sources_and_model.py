"""Sources (video files, image folders, arrays, synthetic clips) and opening detectors: clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamrt.errors import ConfigError, ModelError, ModelNotFoundError
from streamrt.video import (
    ArraySource,
    ImageFolderSource,
    Prefetch,
    SourceError,
    SyntheticClip,
    VideoFileSource,
    open_detector,
    open_source,
    run_detection,
)
from streamrt.video.model import best_backend, read_labels
from streamrt.video.sources import iter_frames
from video.detection_helpers import not_a_detector

cv2 = pytest.importorskip("cv2")


def _write_video(path: Path, frames: int = 6, size: tuple[int, int] = (96, 64)) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 25.0, size)
    for i in range(frames):
        writer.write(np.full((size[1], size[0], 3), 30 * i, np.uint8))
    writer.release()
    return path


def test_video_file_source_reads_every_frame(tmp_path: Path) -> None:
    source = VideoFileSource(_write_video(tmp_path / "clip.mp4"))  # the OpenCV fallback (files open with PyAV)
    assert (source.info.width, source.info.height, source.info.frames, source.info.fps) == (96, 64, 6, 25.0)
    assert source.skip(2) == 2
    frames = list(iter_frames(source))
    assert len(frames) == 4 and frames[0].shape == (64, 96, 3)
    source.close()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_videos_are_clear_errors(tmp_path: Path, damage: str) -> None:
    good = _write_video(tmp_path / "good.mp4").read_bytes()
    data = {"garbage": b"\x00not a video" * 200, "truncated": good[: len(good) // 3], "empty": b""}[damage]
    bad = tmp_path / f"{damage}.mp4"
    bad.write_bytes(data)
    with pytest.raises(SourceError, match=f"{damage}.mp4") as info:
        open_source(str(bad))
    assert "corrupt" in str(info.value)


def test_missing_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not found"):
        open_source(str(tmp_path / "nope.mp4"))
    with pytest.raises(SourceError, match="not found"):
        open_source(str(tmp_path / "nope.png"))


def test_image_folder_source(tmp_path: Path) -> None:
    for i in range(3):
        cv2.imwrite(str(tmp_path / f"{i:02d}.png"), np.full((40, 60, 3), 50 * i, np.uint8))
    cv2.imwrite(str(tmp_path / "03.jpg"), np.zeros((20, 30, 3), np.uint8))  # another size: resized
    (tmp_path / "notes.txt").write_text("ignored")
    source = open_source(str(tmp_path))
    assert isinstance(source, ImageFolderSource) and source.info.frames == 4
    frames = list(iter_frames(source))
    assert [f.shape for f in frames] == [(40, 60, 3)] * 4 and frames[1].mean() == 50


def test_unreadable_image_names_the_file(tmp_path: Path) -> None:
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "b.png").write_bytes(b"not a png")
    source = ImageFolderSource(tmp_path)
    assert source.read() is not None
    with pytest.raises(SourceError, match=r"b\.png"):
        source.read()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceError, match="no images"):
        ImageFolderSource(empty)


def test_synthetic_and_array_sources() -> None:
    source = open_source("synthetic:64x48x5@12:seed=3")
    assert (source.info.width, source.info.height, source.info.frames, source.info.fps) == (64, 48, 5, 12.0)
    assert len(list(iter_frames(source))) == 5
    looped = ArraySource([np.zeros((4, 4, 3), np.uint8)] * 2, loop=True, length=7)
    assert looped.skip(3) == 3 and len(list(iter_frames(looped))) == 4
    with pytest.raises(SourceError):
        ArraySource([])


def test_prefetch_delivers_in_order_and_passes_errors(tmp_path: Path) -> None:
    clip = SyntheticClip(width=32, height=24, frames=5, seed=1)
    prefetched = Prefetch(open_source("synthetic:32x24x5:seed=1"), depth=2)
    frames = list(iter_frames(prefetched))
    prefetched.close()
    assert len(frames) == 5 and all(np.array_equal(f, clip.frame(i)) for i, f in enumerate(frames))
    (tmp_path / "a.png").write_bytes(b"junk")
    cv2.imwrite(str(tmp_path / "0.png"), np.zeros((8, 8, 3), np.uint8))
    failing = Prefetch(ImageFolderSource(tmp_path))
    assert failing.read() is not None
    with pytest.raises(SourceError, match=r"a\.png"):
        failing.read()
    failing.close()


def test_bundled_detector_facts(detector: Any) -> None:
    assert detector.layout.name == "yolov8"
    assert detector.names == ("circle", "square", "triangle", "star", "cross")  # from the ONNX metadata
    assert detector.input_hw == (320, 320) and detector.max_batch == 4 and detector.anchors == 2100
    assert detector.device == "cpu" and detector.backend == "onnxruntime"


def test_labels_file_overrides_metadata(cache_dir: Path, tmp_path: Path) -> None:
    from streamrt.video.model import bundled_model

    labels = tmp_path / "labels.txt"
    labels.write_text("# shapes\na\nb\n\nc\nd\ne\n")
    assert read_labels(labels) == ("a", "b", "c", "d", "e")
    detector = open_detector(bundled_model(), backend="onnxruntime", labels=labels, cache_dir=cache_dir)
    assert detector.names == ("a", "b", "c", "d", "e")
    wrong = tmp_path / "wrong.txt"
    wrong.write_text("a\nb\n")
    with pytest.raises(ModelError, match="with 2 classes"):
        open_detector(bundled_model(), backend="onnxruntime", labels=wrong, cache_dir=cache_dir)


def test_unexpected_output_layout_is_a_clear_error(cache_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="expected a 3-D YOLO output"):
        open_detector(not_a_detector(tmp_path / "classifier.onnx"), backend="onnxruntime", cache_dir=cache_dir)
    with pytest.raises(ModelNotFoundError):
        open_detector(tmp_path / "missing.onnx")


def test_sources_of_different_sizes_are_refused(detector: Any) -> None:
    a = ArraySource([np.zeros((48, 64, 3), np.uint8)])
    b = ArraySource([np.zeros((48, 60, 3), np.uint8)])
    with pytest.raises(ConfigError, match="one frame size"):
        run_detection(detector, [a, b])
    with pytest.raises(ConfigError, match="largest batch"):
        from streamrt.video import DetectConfig

        run_detection(detector, [a], DetectConfig(batch=8))


def test_best_backend_on_this_machine() -> None:
    from streamrt.device import cuda_available

    assert best_backend() in ("tensorrt", "torch_inductor") if cuda_available() else best_backend() == "onnxruntime"
