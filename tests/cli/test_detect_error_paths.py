"""`streamrt detect` on bad input: sources checked before building, damaged videos counted, no partial outputs."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from streamrt.cli.main import main

pytest.importorskip("cv2")
av = pytest.importorskip("av")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def _h264_clip(path: Path, frames: int = 60, size: tuple[int, int] = (160, 96)) -> Path:
    """An H.264 MP4 (media data before the index, as PyAV writes it) of a moving bar on fresh noise."""
    rng = np.random.default_rng()
    width, height = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264" if "libx264" in av.codecs_available else "h264", rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            image = rng.integers(0, 40, (height, width, 3), dtype=np.uint8)
            image[:, (i * 3) % width:(i * 3) % width + 12] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def _mdat(data: bytes) -> tuple[int, int]:
    """Start and end of the media data (the encoded frames) inside an MP4."""
    at = data.find(b"mdat")
    (size,) = struct.unpack(">I", data[at - 4:at])
    return at + 4, at - 4 + size


def _fails(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines, "no error line"
    return lines[-1]


def test_missing_video_fails_before_any_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    line = _fails(["detect", str(tmp_path / "nope.mp4"), "--backend", "onnxruntime", "--cache-dir", str(cache)],
                  capsys)
    assert "video file not found" in line
    assert not cache.exists(), "a plan was built before the source was checked"


def test_malformed_synthetic_spec_names_the_grammar(tmp_path: Path, cache: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails(["detect", "synthetic:abc", "--backend", "onnxruntime", "--cache-dir", str(cache)], capsys)
    assert "cannot parse source 'synthetic:abc'" in line and "synthetic[:WxH[xFRAMES][@FPS]]" in line
    assert "not found" not in line


def test_failed_run_leaves_no_outputs(tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import cv2

    folder = tmp_path / "imgs"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.png"), np.random.default_rng().integers(0, 255, (64, 96, 3), dtype=np.uint8))
    (folder / "b.png").write_bytes(b"not an image")
    out, dets = tmp_path / "o.mp4", tmp_path / "o.jsonl"
    line = _fails(["detect", str(folder), "--backend", "onnxruntime", "--cache-dir", str(cache),
                   "-o", str(out), "--jsonl", str(dets), "--no-progress"], capsys)
    assert "b.png" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs"], "a failed run left files behind"


def test_json_lines_name_the_image_file(tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import cv2

    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng()
    for name in ("b.jpg", "a.png", "c.jpg"):
        cv2.imwrite(str(folder / name), rng.integers(0, 255, (64, 96, 3), dtype=np.uint8))
    dets = tmp_path / "d.jsonl"
    assert main(["detect", str(folder), "synthetic:96x64x3", "--backend", "onnxruntime", "--cache-dir", str(cache),
                 "--jsonl", str(dets), "--no-progress", "--topology", "sync"]) == 0
    records = [json.loads(line) for line in dets.read_text().splitlines()]
    files = {r["frame"]: r["file"] for r in records if r["source"] == 0}
    assert files == {0: "a.png", 1: "b.jpg", 2: "c.jpg"}
    clip = sorted((r["frame"], r["timestamp_s"]) for r in records if r["source"] == 1)
    assert [frame for frame, _ in clip] == [0, 1, 2]
    assert [t for _, t in clip] == pytest.approx([0.0, 1 / 30, 2 / 30], abs=1e-6)
    assert {r["name"] for r in records} == {"imgs", "synthetic:96x64x3"}


def test_damaged_video_counts_bad_frames_quietly(tmp_path: Path, cache: Path, capfd: pytest.CaptureFixture[str],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    clip = _h264_clip(tmp_path / "clip.mp4")
    data = bytearray(clip.read_bytes())
    start, end = _mdat(bytes(data))
    for offset in np.random.default_rng(0).integers(start + 2000, end - 400, 40):
        data[offset:offset + 300] = bytes(300)  # zeroed stretches: NAL units that do not decode
    damaged = tmp_path / "damaged.mp4"
    damaged.write_bytes(bytes(data))
    dets = tmp_path / "d.jsonl"
    assert main(["detect", str(damaged), "--backend", "onnxruntime", "--cache-dir", str(cache),
                 "--jsonl", str(dets), "--no-progress"]) == 0
    assert "[h264 @" not in capfd.readouterr().err, "FFmpeg's own log lines reached stderr"
    decoded = len(dets.read_text().splitlines())
    assert 0 < decoded < 60
    assert f"damaged.mp4: {60 - decoded} of 60 frames could not be decoded" in caplog.text


def test_video_where_nothing_decodes_exits_2(tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clip = _h264_clip(tmp_path / "clip.mp4")
    data = bytearray(clip.read_bytes())
    start, end = _mdat(bytes(data))
    data[start:end] = bytes(end - start)
    dead = tmp_path / "dead.mp4"
    dead.write_bytes(bytes(data))
    line = _fails(["detect", str(dead), "--backend", "onnxruntime", "--cache-dir", str(cache)], capsys)
    assert "none of its 60 frames decodes" in line


def test_annotated_mp4_is_h264(tmp_path: Path, cache: Path) -> None:
    out = tmp_path / "out.mp4"
    assert main(["detect", "synthetic:160x90x6", "--backend", "onnxruntime", "--cache-dir", str(cache),
                 "-o", str(out), "--no-progress"]) == 0
    with av.open(str(out)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert sum(1 for _ in container.decode(stream)) == 6


def test_undecodable_file_is_one_line_without_ffmpeg_chatter(tmp_path: Path, cache: Path,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    clip = _h264_clip(tmp_path / "clip.mp4")
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(clip.read_bytes()[: clip.stat().st_size // 2])  # cut before the index: FFmpeg complains
    assert main(["detect", str(bad), "--backend", "onnxruntime", "--cache-dir", str(cache)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("streamrt detect: error: cannot open video"), err
