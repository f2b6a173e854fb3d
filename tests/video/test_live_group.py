"""Live streams of one decoder pool read by one thread (:mod:`streamrt.video.live_group`), on the CPU with
the decoder processes' stand-in: ``take_ready`` hands every stream's pictures over in order and gives the
slots back, a :class:`LiveGroup` delivers what a :class:`LiveStream` per source delivers (frames in order,
paced, dropped oldest-first), and a detection run over a pool picks the group and counts its engine calls.
The GPU side (NVDEC pictures through ``take_ready`` equal the in-process pool's) is in
``test_decode_processes.py``."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from video.detection_helpers import decoded_nv12  # noqa: E402

FRAMES = 20  # per smoke clip


def test_take_ready_hands_over_every_stream_in_order_and_says_when_they_end(clips: list[Path]) -> None:
    from streamrt.video.decode_processes import ProcessDecodePool

    paths = [clips[0], clips[1], clips[0]]
    refs = {p: decoded_nv12(p) for p in clips}
    seen: list[list[np.ndarray]] = [[] for _ in paths]
    ended: set[int] = set()
    with ProcessDecodePool(paths, processes=2, kind="cpu", slots=2) as pool:  # 2 slots: each reused 10 times
        deadline = time.monotonic() + 60
        while len(ended) < len(paths) and time.monotonic() < deadline:
            ready = pool.take_ready([i for i in range(len(paths)) if i not in ended])
            assert not ready.failed
            for index, picture, pts in ready.taken:
                assert pts == len(seen[index])  # the stand-in's pts is the frame index: in order
                seen[index].append(picture.numpy().copy())
            ended.update(ready.ended)
            if not ready.taken:
                time.sleep(0.002)
    assert ended == {0, 1, 2}
    for i, path in enumerate(paths):
        assert len(seen[i]) == len(refs[path]) == FRAMES
        for k, (got, want) in enumerate(zip(seen[i], refs[path], strict=True)):
            np.testing.assert_array_equal(got, want, err_msg=f"stream {i} frame {k}")


def test_a_group_delivers_each_stream_in_order_paced_and_drops_the_oldest(clips: list[Path]) -> None:
    from streamrt.video.decode_processes import ProcessDecodePool
    from streamrt.video.live_group import LiveGroup, shared_lanes

    paths = [clips[0], clips[1]]
    refs = [decoded_nv12(p) for p in paths]
    with ProcessDecodePool(paths, processes=1, kind="cpu", slots=3) as pool:
        sources = pool.sources()
        shared = shared_lanes(sources)
        assert shared is not None and shared[0] is pool and shared[1] == [0, 1]
        wake = threading.Condition()
        fps = 100.0
        group = LiveGroup(pool, shared[1], [s.info for s in sources], fps=fps, depth=FRAMES, wake=wake,
                          max_frames=[FRAMES, 8])
        for stream in group.streams:
            stream.start()
        started = time.perf_counter()
        assert all(stream.wait_finished(30) for stream in group.streams)
        elapsed = time.perf_counter() - started
        assert elapsed >= (FRAMES - 1) / fps * 0.9  # paced: frame k no earlier than k / fps after the start
        for i, (stream, limit) in enumerate(zip(group.streams, [FRAMES, 8], strict=True)):
            frames = [stream.take() for _ in range(limit)]
            assert stream.take() is None and stream.done
            assert [f.index for f in frames if f is not None] == list(range(limit))
            for k, frame in enumerate(frames):
                assert frame is not None
                np.testing.assert_array_equal(frame.image.numpy(), refs[i][k], err_msg=f"stream {i} frame {k}")
            assert stream.stats() == {"produced": limit, "delivered": limit, "dropped": 0, "queue_depth": FRAMES}
        group.stop()

    with ProcessDecodePool([clips[0]], processes=1, kind="cpu", slots=3) as pool:  # a queue of 2 nobody reads
        small = LiveGroup(pool, [0], [pool.sources()[0].info], fps=0, depth=2)
        (stream,) = small.streams
        stream.start()
        assert stream.wait_finished(30)
        assert stream.stats()["produced"] == FRAMES and stream.stats()["dropped"] == FRAMES - 2
        assert [f.index for f in (stream.take(), stream.take()) if f is not None] == [FRAMES - 2, FRAMES - 1]
        small.stop()


def test_a_failed_stream_raises_in_its_consumer_and_the_others_go_on() -> None:
    from streamrt.video.live_group import LiveGroup, ReadyPictures
    from streamrt.video.sources import SourceError, SourceInfo

    class Lanes:
        def __init__(self) -> None:
            self.given = 0

        def take_ready(self, indices: list[int]) -> ReadyPictures:
            self.given += 1
            return ReadyPictures([(0, self.given, None)] if 0 in indices else [], [], {1: "decoder 1 broke"})

    infos = [SourceInfo(n, 8, 8, 30.0, None) for n in ("ok", "bad")]
    group = LiveGroup(Lanes(), [0, 1], infos, fps=0, depth=4, max_frames=[5, None])
    for stream in group.streams:
        stream.start()
    ok, bad = group.streams
    assert ok.wait_finished(5) and bad.wait_finished(5)
    with pytest.raises(SourceError, match="decoder 1 broke"):
        bad.take()
    assert bad.done
    assert [f.index for f in iter(ok.take, None)] == [1, 2, 3, 4]  # depth 4 of 5: the oldest dropped
    group.stop()


def test_a_stream_started_later_is_paced_from_its_own_start_and_a_late_picture_is_looked_for_again() -> None:
    """The group's heap of due times (2026-12-06): a stream started after the others (admission's queue) joins
    with its own clock, a due picture the decoder has not made yet is asked for again until it comes (not
    skipped, not taken twice), each stream's frames come in order and none before its time."""
    from streamrt.video.live_group import LiveGroup, ReadyPictures
    from streamrt.video.sources import SourceInfo

    fps, frames = 50.0, 6

    class LateLanes:  # stream 1's decoder has nothing for its first 5 asks
        def __init__(self) -> None:
            self.sent, self.asked = [0, 0], [0, 0]

        def take_ready(self, indices: list[int]) -> ReadyPictures:
            taken = []
            for i in indices:
                self.asked[i] += 1
                if i == 1 and self.asked[i] <= 5:
                    continue
                taken.append((i, (i, self.sent[i], time.perf_counter()), None))
                self.sent[i] += 1
            return ReadyPictures(taken, [], {})

    lanes = LateLanes()
    infos = [SourceInfo(n, 8, 8, fps, None) for n in ("early", "late")]
    group = LiveGroup(lanes, [0, 1], infos, fps=fps, depth=frames, max_frames=[frames, frames])
    early, late = group.streams
    early.start()
    time.sleep(0.1)
    late.start()
    assert early.wait_finished(5) and late.wait_finished(5)
    for stream, lane in ((early, 0), (late, 1)):
        got = [f.image for f in iter(stream.take, None)]
        assert [(i, k) for i, k, _ in got] == [(lane, k) for k in range(frames)], got
        assert stream.t0 is not None
        # frame k no earlier than k / fps after the stream's own start (a little slack for the clock)
        assert all(t >= stream.t0 + k / fps - 1e-3 for k, (_, _, t) in enumerate(got)), (stream.t0, got)
    assert late.t0 is not None and early.t0 is not None and late.t0 - early.t0 >= 0.09
    assert lanes.asked[1] >= 5 + frames and lanes.sent == [frames, frames]
    group.stop()


def test_a_stream_started_while_the_thread_sleeps_gets_its_first_frame_at_once() -> None:
    """At 10 FPS the thread sleeps ~100 ms between the first stream's frames; a stream started 30 ms in gets its
    first frame when it starts, not at the first stream's next due time (70 ms late before 2026-12-06)."""
    from streamrt.video.live_group import LiveGroup, ReadyPictures
    from streamrt.video.sources import SourceInfo

    class Lanes:
        def take_ready(self, indices: list[int]) -> ReadyPictures:
            return ReadyPictures([(i, time.perf_counter(), None) for i in indices], [], {})

    infos = [SourceInfo(n, 8, 8, 10.0, None) for n in ("first", "joining")]
    group = LiveGroup(Lanes(), [0, 1], infos, fps=10.0, depth=4, max_frames=[3, 1])
    first, joining = group.streams
    first.start()
    time.sleep(0.03)
    joining.start()
    assert joining.wait_finished(5)
    taken_at = joining.take().image
    assert joining.t0 is not None and taken_at - joining.t0 < 0.02, taken_at - joining.t0
    group.stop()


class _FramePool:
    """Streams of BGR frames in memory behind the pool interface (a CPU engine takes no NV12, so the decoder
    processes' NV12 stand-in cannot feed it): ``take_ready`` hands out each stream's next frame."""

    def __init__(self, streams: int, frames: int, rng: np.random.Generator) -> None:
        from streamrt.video.sources import SourceInfo

        self.frames = [[rng.integers(0, 255, (96, 160, 3), dtype=np.uint8) for _ in range(frames)]
                       for _ in range(streams)]
        self.next = [0] * streams
        self.infos = [SourceInfo(f"cam{i}", 160, 96, 30.0, frames) for i in range(streams)]
        self.lock = threading.Lock()

    def take_ready(self, indices: list[int]) -> Any:
        from streamrt.video.live_group import ReadyPictures

        ready = ReadyPictures()
        with self.lock:
            for i in indices:
                if self.next[i] < len(self.frames[i]):
                    ready.taken.append((i, self.frames[i][self.next[i]], self.next[i]))
                    self.next[i] += 1
                else:
                    ready.ended.append(i)
        return ready

    def sources(self) -> list[Any]:
        pool = self

        class Lane:
            def __init__(self, i: int) -> None:
                self.i, self.info, self.pool_lane = i, pool.infos[i], (pool, i)

            def read(self) -> Any:
                ready = pool.take_ready([self.i])
                return ready.taken[0][1] if ready.taken else None

            def close(self) -> None:
                pass

        return [Lane(i) for i in range(len(self.frames))]


def test_detection_over_a_pool_reads_it_with_one_thread_and_counts_its_calls(detector: Any) -> None:
    from streamrt.errors import ConfigError
    from streamrt.pipeline.config import PipelineConfig, Topology
    from streamrt.video import DetectConfig, run_detection
    from streamrt.video.live import LiveStream
    from streamrt.video.live_group import GroupedStream
    from streamrt.video.runner import _live_streams
    from streamrt.video.sources import open_source

    rng = np.random.default_rng()
    for reader in ("group", "threads"):
        config = DetectConfig(paced=True, live=True, fps=60.0, queue_depth=4, batch=3, max_frames=12,
                              live_reader=reader, pipeline=PipelineConfig(topology=Topology.STREAMS))
        streams = _live_streams(_FramePool(3, 12, rng).sources(), config, 60.0, threading.Condition(), [0, 0, 0])
        assert all(isinstance(s, GroupedStream if reader == "group" else LiveStream) for s in streams)
        report = run_detection(detector, _FramePool(3, 12, rng).sources(), config)
        rows = report.per_source
        assert [r["state"] for r in rows] == ["ran"] * 3, reader
        assert all(r["frames"] + r["dropped"] == 12 for r in rows), (reader, rows)
        assert 0 < report.calls <= report.frames and report.frames_per_call == report.frames / report.calls
        assert report.to_dict()["frames_per_call"] == report.frames_per_call

    with pytest.raises(ConfigError, match="one decoder pool"):
        run_detection(detector, [open_source("synthetic:64x48x3@30")],
                      DetectConfig(paced=True, live=True, live_reader="group"))
    with pytest.raises(ConfigError, match="live_reader"):
        DetectConfig(live_reader="fibres")
