"""The decoder-process pool (:mod:`streamrt.video.decode_processes`): on the CPU with its stand-in (CPU
decoders in the workers, host shared-memory slots), the pictures equal the in-process decoder's, every
stream's frames come in order, slots are handed back (many more frames than slots), a worker that dies
or stalls fails its stream with an error instead of a hang, and closing leaves no process behind. On
the GPU (marked ``gpu``) NVDEC in worker processes, handed over by CUDA IPC, gives the pictures the
in-process NVDEC pool gives."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from video.detection_helpers import decoded_nv12  # noqa: E402

FRAMES = 20  # per smoke clip


def _gone(pids: list[int | None]) -> bool:
    for pid in pids:
        assert pid is not None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


def test_pictures_equal_the_in_process_decoders_in_order_with_slots_handed_back(clips: list[Path]) -> None:
    from streamrt.video.decode_processes import ProcessDecodePool

    paths = [clips[0], clips[1], clips[0]]
    refs = {p: decoded_nv12(p) for p in clips}
    reads = 2 * FRAMES + 5  # two passes and a bit: every slot reused many times
    with ProcessDecodePool(paths, processes=2, kind="cpu", slots=2, loop=True) as pool:
        sources = pool.sources()
        assert [s.info.name for s in sources] == [p.name for p in paths]
        assert (sources[0].info.width, sources[0].info.height, sources[0].frame_format) == (320, 180, "nv12")
        seen: list[list[Any]] = [[] for _ in paths]
        for k in range(reads):
            for i, source in enumerate(sources):  # interleaved, as a batched detector reads them
                picture = source.read()
                assert isinstance(picture, torch.Tensor) and picture.dtype == torch.uint8
                np.testing.assert_array_equal(picture.numpy(), refs[paths[i]][k % FRAMES], err_msg=f"{i} {k}")
                seen[i].append(source.last_pts)
        assert pool.decoded <= reads * len(paths) + 2 * len(paths)  # never more than the slots ahead
        pids = pool.pids
    assert seen == [[k % FRAMES for k in range(reads)]] * len(paths)
    assert _gone(pids)


def test_a_file_ends_skip_and_remove(clips: list[Path]) -> None:
    from streamrt.video.decode_processes import ProcessDecodePool

    with ProcessDecodePool([clips[0]], processes=1, kind="cpu", slots=3) as pool:
        (source,) = pool.sources()
        count = 0
        while source.read() is not None:
            count += 1
        assert count == FRAMES and source.read() is None
        late = pool.add(clips[1], skip=5)
        assert late.read() is not None and late.last_pts == 5
        assert late.skip(3) == 3 and late.read() is not None and late.last_pts == 9
        pool.remove(1)
        assert late.read() is None


def test_a_worker_that_dies_or_stalls_fails_its_stream_not_the_others(clips: list[Path]) -> None:
    from streamrt.video.decode_processes import ProcessDecodePool
    from streamrt.video.sources import SourceError

    with ProcessDecodePool(clips * 2, processes=3, kind="cpu", slots=2, loop=True, timeout_s=1.0) as pool:
        sources = pool.sources()  # streams 0 and 3 on worker 0, 1 on worker 1, 2 on worker 2
        for source in sources:
            assert source.read() is not None
        pids = pool.pids
        os.kill(pids[1], signal.SIGKILL)  # type: ignore[arg-type]
        started = time.monotonic()
        with pytest.raises(SourceError, match=r"decoder process 1 \(pid \d+\) exited with code -9"):
            for _ in range(10 * FRAMES):  # what it announced before dying may come first
                sources[1].read()
        assert time.monotonic() - started < 5
        os.kill(pids[2], signal.SIGSTOP)  # type: ignore[arg-type]
        try:
            with pytest.raises(SourceError, match=r"no picture of smoke1\.mp4 from decoder process 2 in 1 s"):
                for _ in range(10 * FRAMES):
                    sources[2].read()
        finally:
            os.kill(pids[2], signal.SIGCONT)  # type: ignore[arg-type]
        for _ in range(2 * FRAMES):  # the healthy worker's streams go on
            assert sources[0].read() is not None and sources[3].read() is not None
    assert _gone(pids)


def test_a_file_that_cannot_be_decoded_fails_the_pool_and_leaves_no_process(tmp_path: Path) -> None:
    from streamrt.video.decode_processes import ProcessDecodePool
    from streamrt.video.sources import SourceError

    bad = tmp_path / "bad.mp4"
    bad.write_bytes(os.urandom(2000))
    procs: list[Any] = []
    real = ProcessDecodePool.close

    def close(self: Any) -> None:
        procs.extend(self.pids)
        real(self)

    ProcessDecodePool.close = close  # type: ignore[method-assign]
    try:
        with pytest.raises(SourceError, match=r"decoder process 0 cannot decode .*bad\.mp4"):
            ProcessDecodePool([bad], processes=1, kind="cpu")
    finally:
        ProcessDecodePool.close = real  # type: ignore[method-assign]
    assert procs and _gone(procs)


def test_workers_run_at_the_niceness_asked_and_still_decode(clips: list[Path]) -> None:
    """CPU decoders beside NVDEC processes yield the cores (HybridDecode's CPU pool asks +5): each worker's
    niceness is the parent's plus the pool's, and it decodes as before."""
    import os

    from streamrt.video.decode_processes import ProcessDecodePool

    base = os.getpriority(os.PRIO_PROCESS, 0)
    with ProcessDecodePool([clips[0]], processes=2, kind="cpu", slots=2, niceness=3) as pool:
        (source,) = pool.sources()
        assert source.read() is not None  # the workers are past their start by now
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pool.pids] == [min(19, base + 3)] * 2
    with ProcessDecodePool([clips[0]], processes=1, kind="cpu", slots=2) as pool:
        assert pool.sources()[0].read() is not None
        assert os.getpriority(os.PRIO_PROCESS, pool.pids[0]) == base


def test_bad_arguments_name_the_value() -> None:
    from streamrt.errors import ConfigError
    from streamrt.video.decode_processes import ProcessDecodePool

    with pytest.raises(ConfigError, match="processes >= 1 and slots >= 1, got 0, 4"):
        ProcessDecodePool([], processes=0)
    with pytest.raises(ConfigError, match="nvdec, cpu"):
        ProcessDecodePool([], kind="gpu")
    with pytest.raises(ConfigError, match="upload=True is for kind='cpu'"):
        ProcessDecodePool([], kind="nvdec", upload=True)
    with pytest.raises(ConfigError, match=r"niceness must be within 0-19.*got 20"):
        ProcessDecodePool([], kind="cpu", niceness=20)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="torch sees no CUDA GPU"):
            ProcessDecodePool([], kind="cpu", upload=True)


@pytest.mark.gpu
def test_cpu_decoders_uploading_from_page_locked_rings_give_the_host_pictures() -> None:
    """CPU decoders in processes, ``upload=True``: every picture on the GPU, byte for byte the host pool's,
    in order, read per stream and all streams at once (the hybrid's CPU side in decoder processes)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from streamrt.video.decode_processes import ProcessDecodePool

    clips = sorted(Path(os.environ.get("STREAMRT_VIDEO_CLIPS", "build/video-clips")).glob("*.mp4"))[:2]
    if not clips:
        pytest.skip("no clips in STREAMRT_VIDEO_CLIPS (scripts/make_video_clips.py)")
    paths, frames = [clips[0], clips[-1], clips[0]], 12

    def read(pool: Any, ready: bool) -> list[list[tuple[Any, Any]]]:
        out: list[list[tuple[Any, Any]]] = [[] for _ in paths]
        if not ready:
            for i, source in enumerate(pool.sources()):
                for _ in range(frames):
                    picture = source.read()
                    assert picture is not None and picture.is_cuda == pool.upload
                    out[i].append((picture.cpu().clone(), source.last_pts))
            return out
        deadline = time.monotonic() + 120
        while min(len(got) for got in out) < frames and time.monotonic() < deadline:
            taken = pool.take_ready([i for i, got in enumerate(out) if len(got) < frames])
            assert not taken.failed and not taken.ended
            for index, picture, pts in taken.taken:
                assert picture.is_cuda == pool.upload and picture.dtype == torch.uint8
                out[index].append((picture.cpu().clone(), pts))
        return out

    results, pids = {}, []
    for upload in (False, True):
        for ready in (False, True):
            with ProcessDecodePool(paths, processes=2, kind="cpu", slots=2, upload=upload) as pool:
                assert pool.page_locked == (len(paths) if upload else 0)
                results[upload, ready] = read(pool, ready)
                pids += pool.pids
    assert _gone(pids)
    reference = results[False, False]
    for key, other in results.items():
        for i, (a, b) in enumerate(zip(reference, other, strict=True)):
            assert [p for _, p in a] == [p for _, p in b], f"{key}, stream {i}: time stamps differ"
            for k, ((x, _), (y, _)) in enumerate(zip(a, b, strict=True)):
                assert torch.equal(x, y), f"{key}, stream {i} frame {k}: {int((x.int() - y.int()).abs().max())} apart"


@pytest.mark.gpu
def test_nvdec_in_processes_gives_the_in_process_pools_pictures() -> None:
    """NVDEC in 2 worker processes, pictures handed over by CUDA IPC, against the in-process NvdecPool."""
    from streamrt.video.decode_nvdec import NvdecPool, nvdec_available
    from streamrt.video.decode_processes import ProcessDecodePool

    if not nvdec_available():
        pytest.skip("needs PyNvVideoCodec and a CUDA GPU")
    clips = sorted(Path(os.environ.get("STREAMRT_VIDEO_CLIPS", "build/video-clips")).glob("*.mp4"))[:2]
    if not clips:
        pytest.skip("no clips in STREAMRT_VIDEO_CLIPS (scripts/make_video_clips.py)")
    frames = 45
    paths = [clips[0], clips[-1], clips[0]]

    def read(pool: Any) -> list[list[tuple[Any, Any]]]:
        out = []
        for source in pool.sources():
            got = []
            for _ in range(frames):
                picture = source.read()
                assert picture is not None and picture.is_cuda and picture.dtype == torch.uint8
                got.append((picture.cpu(), source.last_pts))
            out.append(got)
        return out

    def read_ready(pool: Any) -> list[list[tuple[Any, Any]]]:
        """The same pictures taken all streams at once (what a LiveGroup reads)."""
        out: list[list[tuple[Any, Any]]] = [[] for _ in paths]
        deadline = time.monotonic() + 60
        while min(len(got) for got in out) < frames and time.monotonic() < deadline:
            ready = pool.take_ready([i for i, got in enumerate(out) if len(got) < frames])
            assert not ready.failed and not ready.ended
            for index, picture, pts in ready.taken:
                assert picture.is_cuda and picture.dtype == torch.uint8
                out[index].append((picture.cpu(), pts))
        return out

    with NvdecPool(paths, workers=2) as pool:
        ours = read(pool)
    with NvdecPool(paths, workers=2) as pool:
        ours_ready = read_ready(pool)
    with ProcessDecodePool(paths, processes=2, kind="nvdec", slots=4) as procs:
        theirs = read(procs)
        pids = procs.pids
    with ProcessDecodePool(paths, processes=2, kind="nvdec", slots=4) as procs:
        theirs_ready = read_ready(procs)
        pids += procs.pids
    assert _gone(pids)
    for name, other in (("decoder processes", theirs), ("in-process take_ready", ours_ready),
                        ("decoder processes' take_ready", theirs_ready)):
        for i, (a, b) in enumerate(zip(ours, other, strict=True)):
            assert [p for _, p in a] == [p for _, p in b], f"{name}, stream {i}: time stamps differ"
            for k, ((x, _), (y, _)) in enumerate(zip(a, b, strict=True)):
                assert torch.equal(x, y), \
                    f"{name}, stream {i} frame {k}: {int((x.int() - y.int()).abs().max())} levels apart"


def test_detect_refuses_decoder_processes_without_nvdec(clips: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    """``streamrt detect --decode-processes N`` on a machine without NVDEC: one line naming what is missing."""
    from streamrt.cli.main import main
    from streamrt.video.decode_nvdec import nvdec_available

    if nvdec_available():
        pytest.skip("NVDEC is here")
    assert main(["detect", str(clips[0]), "--decode-processes", "2", "--no-progress"]) == 2
    assert "--decode-processes needs NVDEC: a CUDA GPU and PyNvVideoCodec" in capsys.readouterr().err
    assert main(["detect", str(clips[0]), "--decode-processes", "-1"]) == 2
    assert "--decode-processes must be >= 0 (0: decode in this process), got -1" in capsys.readouterr().err


def test_detect_with_decoder_processes_that_fail_to_open_exits_with_one_line_and_no_process(
        clips: list[Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """NVDEC said to be here but the workers cannot decode (no CUDA on this machine): the run ends with one
    line naming the worker and its exit code, and the pool it opened is closed (no process left)."""
    from streamrt.cli.main import main
    from streamrt.video import decode_nvdec, decode_processes

    monkeypatch.setattr(decode_nvdec, "nvdec_available", lambda: True)
    opened: list[Any] = []
    real = decode_processes.ProcessDecodePool.close

    def close(self: Any) -> None:
        opened.extend(self.pids)
        real(self)

    monkeypatch.setattr(decode_processes.ProcessDecodePool, "close", close)
    assert main(["detect", str(clips[0]), "--decode-processes", "1", "--no-progress"]) == 2
    assert "decoder process 0 cannot decode" in capsys.readouterr().err
    assert opened and _gone(opened)


def test_a_decoder_process_freezes_torch_out_of_its_collections() -> None:
    """A full collection of a decoder process's heap (torch: ~165,000 objects, ~60 ms) would stall every stream it
    decodes; the process freezes what it loaded and collects the young generation rarely (run in a child: the
    settings are process-wide)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import gc, queue
        from streamrt.pipeline.collector import REALTIME_GC_THRESHOLDS
        from streamrt.video.decode_nvdec import NvdecOptions
        from streamrt.video.decode_worker import _worker_main

        commands, events = queue.Queue(), queue.Queue()
        commands.put(("stop",))
        _worker_main(0, "cpu", 0, NvdecOptions(), commands, events)
        print(gc.get_threshold() == REALTIME_GC_THRESHOLDS, gc.get_freeze_count())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    same, frozen = done.stdout.split()
    assert same == "True" and int(frozen) > 50_000, done.stdout + done.stderr
