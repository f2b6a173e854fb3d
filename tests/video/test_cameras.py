"""Camera sources against a real local stream: an H.264 MPEG-TS clip served over HTTP by a local server.

Covered: frames and timestamps of a whole stream, real-time pacing of a stream served faster than
real time, reconnect with back-off after the server dies mid-stream and comes back, a slow
consumer (drops counted, the queue never above its depth), a camera that never connects (clear
error), the run report's per-camera latency and drops, and RTSP where a local RTSP server
(``mediamtx``) is installed (skipped otherwise).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")

from streamrt.errors import ConfigError
from streamrt.video.cameras import CameraConfig, CameraSource
from streamrt.video.clips import encode_clip
from streamrt.video.sources import SourceError, open_source
from streamrt.video.synthetic import SyntheticClip
from video.stream_server import ClipServer

FPS = 30.0


@pytest.fixture(scope="module")
def clip() -> SyntheticClip:
    return SyntheticClip(width=160, height=96, frames=45, fps=FPS, seed=int(np.random.default_rng().integers(1000)))


@pytest.fixture(scope="module")
def stream(clip: SyntheticClip, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return encode_clip(clip, tmp_path_factory.mktemp("ts") / "clip.ts", crf=18).read_bytes()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(255.0**2 / max(float(np.mean((a.astype(float) - b.astype(float)) ** 2)), 1e-9)))


def _nearest(frame: np.ndarray, clip: SyntheticClip) -> int:
    return int(np.argmax([_psnr(frame, clip.frame(i)) for i in range(clip.frames)]))


def _assert_is_frame(frame: np.ndarray, clip: SyntheticClip, index: int) -> None:
    """``frame`` decodes clip frame ``index``: close to it (H.264 at crf 18 keeps >= 26 dB on these
    clips) and nearest to it or to a neighbour (two consecutive frames of a clip can differ by less
    than the coding noise, when its shapes slow down at a wall: measured margins down to -0.3 dB)."""
    assert _psnr(frame, clip.frame(index)) > 24.0
    assert abs(_nearest(frame, clip) - index) <= 1


def test_whole_stream_paced_in_real_time(clip: SyntheticClip, stream: bytes) -> None:
    with ClipServer(stream) as server:  # served as fast as the socket goes
        cam = open_source(server.url)
        assert isinstance(cam, CameraSource)
        cam.close()
        cam = CameraSource(server.url, CameraConfig(reconnect=False, queue_depth=64))
        assert (cam.info.width, cam.info.height, cam.info.fps) == (160, 96, FPS)
        frames, times, arrivals = [], [], []
        while (frame := cam.read()) is not None:
            frames.append(frame)
            times.append(cam.last_time)
            arrivals.append(cam.last_captured)
        cam.close()
    assert len(frames) == clip.frames
    assert times == pytest.approx([i / FPS for i in range(clip.frames)], abs=1e-6)
    # Paced: the last frame is released (frames - 1) / fps after the first, not as fast as decoding goes.
    assert arrivals[-1] - arrivals[0] == pytest.approx((clip.frames - 1) / FPS, abs=0.25)
    for i in range(0, len(frames), 7):
        _assert_is_frame(frames[i], clip, i)
    stats = cam.stats()
    assert (stats.decoded, stats.delivered, stats.dropped, stats.reconnects) == (clip.frames, clip.frames, 0, 0)


def test_reconnects_with_backoff_after_the_server_dies(clip: SyntheticClip, stream: bytes) -> None:
    rate = len(stream) / (clip.frames / FPS)  # bytes per second of a live encoder
    server = ClipServer(stream, rate=rate).start()
    cam = CameraSource(server.url, CameraConfig(queue_depth=64, backoff_s=0.2, backoff_max_s=0.4, timeout_s=2))
    try:
        before = [cam.read() for _ in range(8)]
        server.kill()  # mid-stream: the open connection is cut, nothing listens
        time.sleep(0.8)
        server.start()  # back on the same port
        after = []
        deadline = time.monotonic() + 20
        while len(after) < 10 and time.monotonic() < deadline:
            frame = cam.read()
            assert frame is not None
            if cam.stats().reconnects >= 1:
                after.append((frame, cam.last_time))
        stats = cam.stats()
    finally:
        cam.close()
        server.kill()
    assert all(f is not None for f in before)
    assert stats.reconnects >= 1 and server.connections >= 2, stats
    assert stats.last_error is not None
    assert len(after) == 10
    # The new connection starts the clip over: its timestamps restart at 0 and its frames are the clip's.
    firsts = [t for _, t in after]
    assert min(firsts) == pytest.approx(0.0, abs=1e-6)
    frame, t = after[-1]
    _assert_is_frame(frame, clip, round(t * FPS))


def test_slow_consumer_drops_oldest_and_memory_stays_bounded(clip: SyntheticClip, stream: bytes) -> None:
    depth = 3
    with ClipServer(stream) as server:
        cam = CameraSource(server.url, CameraConfig(reconnect=False, queue_depth=depth))
        got = []
        while cam.read() is not None:
            got.append(cam.last_time)
            time.sleep(0.15)  # a consumer at ~6 FPS behind a 30 FPS camera
        stats = cam.stats()
        cam.close()
    assert stats.max_queued <= depth
    assert stats.dropped > 0
    assert stats.delivered + stats.dropped == stats.decoded == clip.frames
    assert got == sorted(got) and got[-1] == pytest.approx((clip.frames - 1) / FPS)  # the newest frame made it


def test_a_camera_that_never_connects_is_a_clear_error() -> None:
    cam = CameraSource("http://127.0.0.1:9/none.ts", CameraConfig(reconnect=False, timeout_s=1))
    with pytest.raises(SourceError, match=r"camera http://127\.0\.0\.1:9/none\.ts delivered no frame"):
        _ = cam.info
    cam.close()
    with pytest.raises(ConfigError, match="queue_depth"):
        CameraConfig(queue_depth=0)
    assert [CameraConfig(backoff_s=0.5, backoff_max_s=3).backoff(n) for n in (1, 2, 3, 4)] == [0.5, 1, 2, 3]


def test_run_report_has_per_camera_latency_and_drops(detector: object, clip: SyntheticClip, stream: bytes) -> None:
    from streamrt.video import DetectConfig, run_detection

    with ClipServer(stream) as server:
        cams = [CameraSource(server.url, CameraConfig(reconnect=False, queue_depth=2)) for _ in range(2)]
        report = run_detection(detector, cams, DetectConfig())  # type: ignore[arg-type]
        for cam in cams:
            cam.close()
    assert len(report.per_source) == 2
    for row in report.per_source:
        assert row["frames"] > 0 and row["p50_ms"] > 0 and row["reconnects"] == 0
        assert row["delivered"] + row["dropped"] == clip.frames
    assert report.dropped == sum(row["dropped"] for row in report.per_source)
    assert report.frames == sum(row["frames"] for row in report.per_source)
    assert "camera http://" in report.format_text()


@pytest.mark.skipif(shutil.which("mediamtx") is None, reason="no local RTSP server (mediamtx) installed")
def test_rtsp_stream_from_a_local_server(clip: SyntheticClip, tmp_path: Path) -> None:  # pragma: no cover
    ts = encode_clip(clip, tmp_path / "clip.ts")
    server = subprocess.Popen(["mediamtx"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        import av

        url = "rtsp://127.0.0.1:8554/cam"
        with av.open(str(ts)) as src, av.open(url, "w", format="rtsp", options={"rtsp_transport": "tcp"}) as out:
            pusher = out.add_stream_from_template(src.streams.video[0])
            cam = CameraSource(url, CameraConfig(reconnect=False))
            for packet in src.demux(src.streams.video[0]):
                if packet.dts is not None:
                    packet.stream = pusher
                    out.mux(packet)
            assert cam.read() is not None
            cam.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
