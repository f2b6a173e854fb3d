"""CPU decoding with PyAV: H.264 and H.265 clips made here from the synthetic scenes, decoded back.

Decoded frames must match their source frames to within a lossy-codec tolerance (PSNR >= 28 dB,
what JPEG at quality ~75 gives on these scenes), in order (each decoded frame is closer to its
own source frame than to the next one), with the right count and timestamps ``i / fps``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")

from streamrt.errors import ConfigError
from streamrt.video.clips import encode_clip
from streamrt.video.decode_av import AvSource, is_stream_url
from streamrt.video.decoding import DecodeConfig, open_decoded
from streamrt.video.sources import SourceError, VideoFileSource, iter_frames, open_source
from streamrt.video.synthetic import SyntheticClip


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 10 * np.log10(255.0**2 / max(mse, 1e-12))


@pytest.mark.parametrize("codec", ["h264", "h265"])
@pytest.mark.parametrize("threads", [1, 3])
def test_decoded_frames_match_the_source_frames(tmp_path: Path, codec: str, threads: int) -> None:
    seed = int(np.random.default_rng().integers(0, 10_000))
    clip = SyntheticClip(width=320, height=176, frames=24, fps=24.0, seed=seed)
    path = encode_clip(clip, tmp_path / f"clip-{codec}.mp4", codec=codec, crf=18, bframes=2)
    source = AvSource(path, threads=threads)
    assert (source.info.width, source.info.height, source.info.frames, source.info.fps) == (320, 176, 24, 24.0)
    times = []
    frames = []
    while (frame := source.read()) is not None:
        frames.append(frame)
        times.append(source.last_time)
    source.close()
    assert len(frames) == clip.frames
    assert times == pytest.approx([i / 24.0 for i in range(clip.frames)], abs=1e-6)
    # Random clips at crf 18 keep >= 26 dB per frame (measured over 50 seeds, both codecs); two
    # consecutive frames can be closer than the coding noise when the shapes slow down at a wall
    # (margins down to +0.14 dB, +0.21 dB on average over a nearly still clip), so order is checked
    # per frame with 0.5 dB of slack and strictly over the whole clip (in order beats shifted by one).
    own = [_psnr(frame, clip.frame(i)) for i, frame in enumerate(frames)]
    shifted = [_psnr(frame, clip.frame(i + 1)) for i, frame in enumerate(frames[:-1])]
    for i, frame in enumerate(frames):
        assert frame.shape == (176, 320, 3) and frame.dtype == np.uint8
        assert own[i] >= 24.0, f"frame {i}: PSNR {own[i]:.1f} dB"
        if i + 1 < clip.frames:
            assert own[i] > shifted[i] - 0.5, f"frame {i} decoded out of order"
    assert sum(own[:-1]) > sum(shifted), "frames decoded out of order"
    assert source.bad_frames == 0


def test_skip_drops_frames_without_converting_them(tmp_path: Path) -> None:
    clip = SyntheticClip(width=160, height=96, frames=12, fps=30.0, seed=5)
    source = AvSource(encode_clip(clip, tmp_path / "c.mp4"))
    assert source.skip(5) == 5
    frame = source.read()
    assert frame is not None and source.last_time == pytest.approx(5 / 30.0)
    assert _psnr(frame, clip.frame(5)) > _psnr(frame, clip.frame(4))
    assert source.skip(100) == 6
    assert source.read() is None and source.frames_read == 12
    source.close()


def test_open_source_decodes_files_with_pyav_and_opencv_stays_as_fallback(tmp_path: Path) -> None:
    clip = SyntheticClip(width=160, height=96, frames=6, fps=30.0, seed=1)
    path = str(encode_clip(clip, tmp_path / "c.mp4"))
    source = open_source(path)
    assert isinstance(source, AvSource)
    ours = list(iter_frames(source))
    fallback = open_decoded(path, config=DecodeConfig(decoder="opencv"))
    assert isinstance(fallback, VideoFileSource)
    theirs = list(iter_frames(fallback))
    assert len(ours) == len(theirs) == 6
    for a, b in zip(ours, theirs, strict=True):  # the same FFmpeg decoder; only YUV->BGR rounding differs
        assert _psnr(a, b) >= 40.0
    assert DecodeConfig().resolved == "pyav"
    with pytest.raises(ConfigError, match="decoder must be one of"):
        DecodeConfig(decoder="ffmpeg")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_damaged_files_are_clear_errors(tmp_path: Path, damage: str) -> None:
    good = encode_clip(SyntheticClip(width=160, height=96, frames=10, seed=2), tmp_path / "good.mp4").read_bytes()
    data = {"garbage": b"\x00not a video" * 200, "truncated": good[: len(good) // 3], "empty": b""}[damage]
    bad = tmp_path / f"{damage}.mp4"
    bad.write_bytes(data)
    with pytest.raises(SourceError, match=f"{damage}.mp4") as info:
        AvSource(bad)
    assert "corrupt" in str(info.value)
    with pytest.raises(SourceError, match="not found"):
        AvSource(tmp_path / "missing.mp4")


def test_stream_urls_are_recognised() -> None:
    assert is_stream_url("rtsp://cam/1") and is_stream_url("HTTP://host/x.ts")
    assert not is_stream_url("clip.mp4") and not is_stream_url("/data/http.mp4")


def test_opencv_nv12_fallback_matches_the_decoders_planes(tmp_path: Path) -> None:
    from streamrt.video.decoding import OpenCvNv12Source

    clip = SyntheticClip(width=320, height=180, frames=5, fps=30.0, seed=int(np.random.default_rng().integers(99)))
    path = encode_clip(clip, tmp_path / "c.mp4", crf=18)
    ours = list(iter_frames(OpenCvNv12Source(path)))
    exact = list(iter_frames(AvSource(path, output="nv12")))
    assert len(ours) == len(exact) == 5
    for a, b in zip(ours, exact, strict=True):
        assert a.shape == b.shape == (270, 320)
        # Decoded planes -> BGR (FFmpeg) -> I420 (OpenCV): the round trip costs about one level.
        assert np.abs(a.astype(int) - b.astype(int)).mean() < 1.5
    # FFmpeg held to one thread (a CPU decoder process's cap) decodes the same pictures
    capped = list(iter_frames(OpenCvNv12Source(path, threads=1)))
    assert len(capped) == 5 and all(np.array_equal(a, b) for a, b in zip(ours, capped, strict=True))


def test_damaged_stretches_are_skipped_counted_and_quiet(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    import struct

    clip = SyntheticClip(width=160, height=96, frames=60, fps=30.0, seed=4)
    data = bytearray(encode_clip(clip, tmp_path / "c.mp4", crf=30).read_bytes())
    at = data.find(b"mdat")
    (size,) = struct.unpack(">I", bytes(data[at - 4:at]))
    start, end = at + 4, at - 4 + size
    for offset in np.random.default_rng(0).integers(start + 1000, end - 400, 30):
        data[offset:offset + 300] = bytes(300)  # zeroed stretches: NAL units that do not decode
    damaged = tmp_path / "damaged.mp4"
    damaged.write_bytes(bytes(data))
    source = AvSource(damaged)
    decoded = len(list(iter_frames(source)))
    assert 0 < decoded < 60 and source.bad_frames == 60 - decoded
    assert f"damaged.mp4: {60 - decoded} of 60 frames could not be decoded" in caplog.text
    assert "[h264 @" not in capfd.readouterr().err  # FFmpeg's own log stays off


@pytest.mark.parametrize("codec", ["h264", "h265"])
@pytest.mark.parametrize("output", ["bgr", "nv12"])
def test_a_rewound_file_gives_the_same_frames_as_a_fresh_open(tmp_path: Path, codec: str, output: str) -> None:
    """Looped streams start over with a seek (``rewind``) instead of a new open: every pass, rewound at the
    end or halfway through, equals a fresh decoder's frames exactly, with times from 0 again (B-frames, so the
    decoder's reordering buffer must not carry a frame of the old pass into the new)."""
    from streamrt.video.decoding import start_over

    seed = int(np.random.default_rng().integers(0, 10_000))
    path = encode_clip(SyntheticClip(width=160, height=96, frames=18, fps=30.0, seed=seed),
                       tmp_path / f"c-{codec}.mp4", codec=codec, bframes=2)
    fresh = AvSource(path, output=output)
    reference = []
    while (frame := fresh.read()) is not None:
        reference.append(frame)
    fresh.close()
    assert len(reference) == 18
    source = AvSource(path, output=output)
    for stop in (18, 7, 0, 18):  # to the end, then halfway, then at once, then to the end again
        got = [source.read() for _ in range(stop)]
        if stop == 18:
            assert source.read() is None
        for k, frame in enumerate(got):
            np.testing.assert_array_equal(frame, reference[k], err_msg=f"frame {k} after stopping at {stop}")
        same = start_over(source, lambda: pytest.fail("rewinding a file reopened it"))
        assert same is source and source.frames_read == 0
    first = source.read()
    assert source.last_time == 0.0 and first is not None
    np.testing.assert_array_equal(first, reference[0])
    source.close()


def test_start_over_reopens_what_cannot_seek() -> None:
    from streamrt.video.decoding import start_over

    class Plain:
        closed = False

        def close(self) -> None:
            self.closed = True

    class Stream(Plain):
        def rewind(self) -> bool:
            return False  # a network stream

    for old in (Plain(), Stream()):
        new = start_over(old, lambda: "reopened")
        assert new == "reopened" and old.closed


@pytest.mark.parametrize("codec", ["h264", "h265"])
@pytest.mark.parametrize("output", ["bgr", "nv12"])
def test_a_rewound_opencv_file_gives_the_same_frames_as_a_fresh_open(tmp_path: Path, codec: str, output: str) -> None:
    """OpenCV's decoders (the CPU side where PyAV is not installed, as on the H200 image) start over by a seek
    too: every pass, rewound at the end, halfway or at once, equals a fresh capture's frames exactly."""
    pytest.importorskip("cv2")
    from streamrt.video.decoding import OpenCvNv12Source, start_over

    opener = VideoFileSource if output == "bgr" else OpenCvNv12Source
    seed = int(np.random.default_rng().integers(0, 10_000))
    path = encode_clip(SyntheticClip(width=160, height=96, frames=18, fps=30.0, seed=seed),
                       tmp_path / f"c-{codec}.mp4", codec=codec, bframes=2)
    fresh = opener(path)
    reference = []
    while (frame := fresh.read()) is not None:
        reference.append(frame)
    fresh.close()
    assert len(reference) == 18
    source = opener(path)
    for stop in (18, 7, 0, 18):
        got = [source.read() for _ in range(stop)]
        if stop == 18:
            assert source.read() is None
        for k, frame in enumerate(got):
            np.testing.assert_array_equal(frame, reference[k], err_msg=f"frame {k} after stopping at {stop}")
        assert start_over(source, lambda: pytest.fail("rewinding a file reopened it")) is source
    np.testing.assert_array_equal(source.read(), reference[0])
    source.close()
