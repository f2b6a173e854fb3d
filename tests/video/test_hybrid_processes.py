"""Hybrid decode with every decoder in processes (``HybridDecode(decode_processes=N)``), on the CPU: both
sides are the decoder processes' CPU stand-in. Every stream's pictures, whichever side decodes it, equal a
plain decoder's and come in order through one :class:`~streamrt.video.live_group.LiveGroup`; a move, made
while the stream keeps being read, keeps the order; a detection run over the hybrid reads it with one
thread, no decoding thread per stream in the consumer. The NVDEC side is the GPU's (``test_nvdec.py``)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("av")

from streamrt.errors import ConfigError  # noqa: E402
from streamrt.video.hybrid import HybridDecode  # noqa: E402
from streamrt.video.hybrid_capacity import CPU_DECODER_NICENESS, cpu_decoder_processes  # noqa: E402
from streamrt.video.hybrid_policy import HybridPolicy  # noqa: E402
from video.detection_helpers import FakeCudaDevice, ImportedEngine, decoded_nv12  # noqa: E402

FRAMES = 20  # per smoke clip


def _hybrid(paths: list[Path], nvdec_fps: float, **kwargs: Any) -> HybridDecode:
    """``paths`` over both sides: NVDEC's (its CPU stand-in) planned to ``nvdec_fps``, the CPU's beyond."""
    policy = HybridPolicy({"nvdec": nvdec_fps, "cpu": 1000.0}, headroom=1.0, hold_s=0.0)
    return HybridDecode(paths, policy=policy, interval_s=0, decode_processes=1, cpu_processes=1,
                        process_kind="cpu", **kwargs)


def test_both_sides_in_processes_deliver_every_stream_in_order_through_one_group(clips: list[Path]) -> None:
    from streamrt.video.live_group import LiveGroup, shared_lanes

    paths = [clips[0], clips[1]] * 4
    refs = {p: decoded_nv12(p) for p in clips}
    before = {t.ident for t in threading.enumerate()}
    with _hybrid(paths, nvdec_fps=120.0, cpu_niceness=4) as hybrid:
        assert hybrid.assignment == ["nvdec"] * 4 + ["cpu"] * 4
        sources = hybrid.sources()
        shared = shared_lanes(sources)
        assert shared is not None and shared[0] is hybrid and shared[1] == list(range(8))
        group = LiveGroup(hybrid, shared[1], [s.info for s in sources], fps=30.0, depth=FRAMES + 1)
        for stream in group.streams:
            stream.start()
        new_threads = [t.name for t in threading.enumerate() if t.ident not in before]  # while all are running
        assert all(stream.wait_finished(60) for stream in group.streams)
        got = [[frame.image.numpy().copy() for frame in iter(stream.take, None)] for stream in group.streams]
        group.stop()
        pids = hybrid._nvdec.pids + hybrid._cpu.pids
        # the CPU decoders asked to yield the cores do; the NVDEC side does not
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, hybrid._cpu.pids[0]) == min(19, base + 4)
        assert os.getpriority(os.PRIO_PROCESS, hybrid._nvdec.pids[0]) == base
        assert hybrid.summary()["cpu_niceness"] == 4 != CPU_DECODER_NICENESS
    for i, path in enumerate(paths):
        assert len(got[i]) == FRAMES, i
        for k, picture in enumerate(got[i]):
            np.testing.assert_array_equal(picture, refs[path][k], err_msg=f"stream {i} frame {k}")
    # the group's thread, each pool's dispatcher, torch's fd sharer: none per stream
    assert "live-group" in new_threads and len(new_threads) < len(paths), new_threads
    assert not any(name.startswith(("live:", "decode:")) for name in new_threads), new_threads
    assert all(s.read_count == FRAMES for s in sources)
    assert len(set(pids)) == 2


def _read_all(hybrid: HybridDecode, index: int, count: int) -> list[np.ndarray]:
    """``count`` pictures of stream ``index`` through ``take_ready``, as the live group asks for them."""
    out: list[np.ndarray] = []
    deadline = time.monotonic() + 60
    while len(out) < count and time.monotonic() < deadline:
        ready = hybrid.take_ready([index])
        assert not ready.failed and not ready.ended
        out.extend(picture.numpy().copy() for _, picture, _ in ready.taken)
    return out


def test_a_move_while_the_stream_is_read_keeps_its_order(clips: list[Path]) -> None:
    """The stream moves NVDEC -> CPU -> NVDEC while a reader keeps taking its pictures; the new lane opens
    at the frame reached then, and what it decoded before the frame reached at the switch is dropped."""
    ref = decoded_nv12(clips[0])
    reads = 3 * FRAMES
    with _hybrid([clips[0]], nvdec_fps=60.0, loop=True, depth=2) as hybrid:
        (source,) = hybrid.sources()
        assert source.decoder == "nvdec"
        got: list[np.ndarray] = []
        for target in ("cpu", "nvdec"):
            mover = threading.Thread(target=source.switch, args=(target,))
            mover.start()
            while mover.is_alive():  # reading on meanwhile: the new lane starts behind the stream
                got.extend(_read_all(hybrid, 0, 1))
            got.extend(_read_all(hybrid, 0, 3))  # the switch, and the new lane's first pictures
            assert source.decoder == target
        got.extend(_read_all(hybrid, 0, reads - len(got)))
        stats = source.stats().to_dict()
    assert stats["moves"] == 2 and stats["decoder"] == "nvdec"
    assert len(got) >= reads
    for k, picture in enumerate(got):
        np.testing.assert_array_equal(picture, ref[k % FRAMES], err_msg=f"frame {k} (drops {stats['move_drops']})")


def test_streams_start_at_their_own_frames_and_a_move_keeps_the_offset(clips: list[Path]) -> None:
    """``start_frames``: each stream's first picture is its file's frame ``start`` (looped files that all start at 0
    start over at the same moment); a stream moved to the other side goes on from its own frame."""
    ref = decoded_nv12(clips[0])
    starts = [0, 7, 13, 19]
    with _hybrid([clips[0]] * 4, nvdec_fps=60.0, loop=True, start_frames=starts) as hybrid:
        assert hybrid.assignment == ["nvdec", "nvdec", "cpu", "cpu"]
        got = [_read_all(hybrid, i, 4) for i in range(4)]
        source = hybrid.sources()[1]
        source.switch("cpu")
        moved = _read_all(hybrid, 1, 6)
    for i, start in enumerate(starts):
        for k, picture in enumerate(got[i]):
            np.testing.assert_array_equal(picture, ref[(start + k) % FRAMES], err_msg=f"stream {i} frame {k}")
    for k, picture in enumerate(moved):  # stream 1 read 4 pictures before its move
        np.testing.assert_array_equal(picture, ref[(7 + 4 + k) % FRAMES], err_msg=f"after the move, frame {k}")
    with pytest.raises(ConfigError, match="one frame >= 0 per stream"):
        _hybrid([clips[0]] * 2, nvdec_fps=60.0, start_frames=[0])


def test_a_removed_stream_stops_decoding_leaves_the_plan_and_never_moves(clips: list[Path]) -> None:
    """``HybridDecode.remove`` (admission refused the stream): its lane leaves its pool, it reads as ended, the
    summary no longer counts it, the policy's rebalance never moves it; the others read on in order."""
    paths = [clips[0], clips[1], clips[0]]
    refs = {p: decoded_nv12(p) for p in clips}
    with _hybrid(paths, nvdec_fps=60.0) as hybrid:  # 2 on NVDEC's stand-in, 1 on the CPU side
        assert hybrid.assignment == ["nvdec", "nvdec", "cpu"]
        _, lane = hybrid.sources()[1]._impl.pool_lane
        hybrid.remove(1)
        hybrid.remove(1)  # twice is once
        assert hybrid.sources()[1].read() is None and hybrid.demands[1] == 0.0
        ready = hybrid.take_ready([1])
        assert ready.ended == [1] and not ready.taken
        assert hybrid.summary()["assignment"] == {"nvdec": 1, "cpu": 1} and hybrid.summary()["removed"] == 1
        assert hybrid._nvdec._lanes[lane].finished  # its worker was told to stop decoding it
        cpu_lanes = len(hybrid._cpu._lanes)
        hybrid.sources()[1].switch("cpu")  # a move asked for a removed stream opens nothing
        assert hybrid.sources()[1]._incoming is None and len(hybrid._cpu._lanes) == cpu_lanes
        # the CPU side over its plan: only a stream with demand may move back to NVDEC's freed room
        hybrid.policy.capacity["cpu"] = 1.0
        hybrid.policy.hold_s = 0.0
        moves = hybrid.policy.rebalance(list(hybrid.assignment), hybrid.demands)
        assert all(m.stream != 1 for m in moves) and any(m.stream == 2 for m in moves), moves
        for i in (0, 2):
            got = _read_all(hybrid, i, 5)
            for k, picture in enumerate(got):
                np.testing.assert_array_equal(picture, refs[paths[i]][k], err_msg=f"stream {i} frame {k}")


def test_a_move_between_reads_keeps_the_order(clips: list[Path]) -> None:
    ref = decoded_nv12(clips[1])
    with _hybrid([clips[1]], nvdec_fps=60.0) as hybrid:
        (source,) = hybrid.sources()
        got = [source.read() for _ in range(5)]
        source.switch("cpu")
        source.switch("nvdec")  # moved back before it arrived: the CPU lane is given up
        source.switch("cpu")
        got += [source.read() for _ in range(5)]
        assert source.decoder == "cpu" and source.moves == 1
        got += [source.read() for _ in range(FRAMES - 10)]
        assert source.read() is None  # the end of the file, on the CPU side
    for k, picture in enumerate(got):
        np.testing.assert_array_equal(picture.numpy(), ref[k], err_msg=f"frame {k}")


def test_detection_over_the_hybrid_reads_it_with_one_thread(detector: Any, clips: list[Path]) -> None:
    from streamrt.pipeline.config import PipelineConfig
    from streamrt.video import DetectConfig, Detections, Frame, run_detection
    from streamrt.video.decode_av import AvSource

    model = dataclasses.replace(detector, engine=ImportedEngine("cpu"), device="cuda", backend="torch", max_batch=4)
    paths = [clips[i % 2] for i in range(6)]
    seen: list[set[str]] = []
    got: list[Detections] = []

    def keep(frame: Frame, det: Detections) -> None:
        got.append(det)
        seen.append({t.name.split(":")[0] for t in threading.enumerate()})

    config = DetectConfig(paced=True, live=True, fps=30.0, queue_depth=FRAMES, batch=3,
                          pipeline=PipelineConfig(trace=False), use_triton=False)
    with _hybrid(paths, nvdec_fps=90.0) as hybrid:
        assert hybrid.assignment == ["nvdec"] * 3 + ["cpu"] * 3
        report = run_detection(model, hybrid.sources(), config, on_result=keep, device=FakeCudaDevice())
    assert all(row["frames"] == FRAMES and row["dropped"] == 0 for row in report.per_source), report.per_source
    names = set().union(*seen)
    assert "live-group" in names and not names & {"live", "decode", "prefetch"}, names
    want: list[Detections] = []
    run_detection(model, [AvSource(p, output="nv12") for p in paths], DetectConfig(
        pipeline=PipelineConfig(trace=False), use_triton=False), on_result=lambda f, d: want.append(d),
        device=FakeCudaDevice())
    key = lambda d: (d.source, d.index)  # noqa: E731
    got, want = sorted(got, key=key), sorted(want, key=key)
    assert len(got) == len(want) == 6 * FRAMES
    assert all(a.same_as(b, atol=1e-4) for a, b in zip(got, want, strict=True))


def test_cpu_decoders_get_the_cores_the_consumer_and_nvdec_processes_leave() -> None:
    assert cpu_decoder_processes(4, cores=16) == 10
    assert cpu_decoder_processes(0, cores=16) == 14
    assert cpu_decoder_processes(4, cores=4) == 1  # always one
