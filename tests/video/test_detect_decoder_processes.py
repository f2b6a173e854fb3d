"""``streamrt detect --decode-processes N [--hybrid]`` on the CPU, the decoder processes' CPU stand-in in place of
NVDEC: the pool's NV12 streams reach the runner as the pool's own streams (until 2026-12-06 every frame went
through a ``Prefetch`` thread that lost the frame format and asserted a BGR array: the first picture ended the run
in an ``AssertionError``), admission measures the decoders the way the run uses them, and ``--hybrid`` plans within
its own headroom. The run itself then stops where a CPU engine cannot take NV12 pictures; on the GPU (marked ``gpu``)
it runs to the end and its detections equal the in-process decoder's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """NVDEC said to be here, every decoder-process pool the CPU stand-in; the streams the runner got."""
    from streamrt.video import decode_nvdec, decode_processes, runner

    monkeypatch.setattr(decode_nvdec, "nvdec_available", lambda: True)
    real_pool = decode_processes.ProcessDecodePool

    class CpuStandIn(real_pool):  # type: ignore[misc, valid-type]
        def __init__(self, paths: Any, **kwargs: Any) -> None:
            super().__init__(paths, **{**kwargs, "kind": "cpu"})

    monkeypatch.setattr(decode_processes, "ProcessDecodePool", CpuStandIn)
    got: list[Any] = []
    real_run = runner.run_detection

    def run_detection(model: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        got.extend(sources)
        return real_run(model, sources, *args, **kwargs)

    monkeypatch.setattr(runner, "run_detection", run_detection)  # the CLI imports it at call time
    return got


def test_decoder_processes_streams_reach_the_runner_as_the_pools_own(
        clips: list[Path], stand_in: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    from streamrt.cli.main import main

    assert main(["detect", str(clips[0]), str(clips[1]), "--decode-processes", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "AssertionError" not in err and "Traceback" not in err
    assert "frame_format must be bgr, or nv12 on a CUDA engine; got 'nv12' on cpu" in err
    assert len(stand_in) == 2 and all(s.pool_lane is not None and s.frame_format == "nv12" for s in stand_in)


def test_paced_decoder_processes_are_admitted_from_their_own_measurement(
        clips: list[Path], stand_in: list[Any], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from streamrt.cli.main import main

    code = main(["detect", str(clips[0]), str(clips[1]), "--decode-processes", "1", "--paced", "--fps", "30",
                 "--no-progress", "--cache-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "(nvdec in 1 decoder processes, 2 sessions)" in out and "at 90% headroom" in out
    records = list((tmp_path / "capacity").glob("*.json"))
    assert len(records) == 1
    assert json.loads(records[0].read_text())["decoder"] == "nvdec in 1 decoder processes, 2 sessions"
    assert len(stand_in) == 2 and all(s.pool_lane is not None for s in stand_in)


def test_refused_streams_stop_decoding_before_the_run(
        clips: list[Path], stand_in: list[Any], capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream admission refuses never starts: its decoder-process lane is removed before the run (an NVDEC
    session and its pictures each), the admitted one is not."""
    from streamrt.cli.main import main
    from streamrt.video import admission, decode_processes

    monkeypatch.setattr(admission, "plan_admission",
                        lambda fps, record, config: admission.Admission([0], refused=[1], message="one of two"))
    removed: list[int] = []
    real = decode_processes.ProcessDecodePool.remove
    monkeypatch.setattr(decode_processes.ProcessDecodePool, "remove",
                        lambda self, index: (removed.append(index), real(self, index))[1])
    code = main(["detect", str(clips[0]), str(clips[1]), "--decode-processes", "1", "--paced", "--fps", "30",
                 "--no-progress", "--cache-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2 and "one of two" in out, out + err  # (then NV12 on a CPU engine stops the run)
    assert removed == [1] and len(stand_in) == 2


def test_hybrid_refused_streams_stop_decoding_before_the_run(
        clips: list[Path], stand_in: list[Any], capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``--hybrid`` too (until 2026-12-06 a refused stream kept its decoder and its place in the plan to the
    end: 31 of 185 on an H100): the hybrid removes it, the admitted one keeps decoding."""
    from streamrt.cli.main import main
    from streamrt.video import admission
    from streamrt.video.hybrid import HybridDecode

    monkeypatch.setattr(admission, "plan_admission",
                        lambda fps, record, config: admission.Admission([0], refused=[1], message="one of two"))
    removed: list[int] = []
    real = HybridDecode.remove
    monkeypatch.setattr(HybridDecode, "remove", lambda self, index: (removed.append(index), real(self, index))[1])
    code = main(["detect", str(clips[0]), str(clips[1]), "--decode-processes", "1", "--hybrid", "--paced",
                 "--fps", "30", "--no-progress", "--cache-dir", str(tmp_path), "--cpu-decoders", "1"])
    out, err = capsys.readouterr()
    assert code == 2 and "one of two" in out, out + err
    assert removed == [1] and [s.removed for s in stand_in] == [False, True]


def test_hybrid_plans_and_admits_within_its_headroom(
        clips: list[Path], stand_in: list[Any], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from streamrt.cli.main import main

    code = main(["detect", str(clips[0]), str(clips[1]), "--decode-processes", "1", "--hybrid", "--paced",
                 "--fps", "30", "--no-progress", "--cache-dir", str(tmp_path), "--cpu-decoders", "1"])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "(nvdec+cpu (1 NVDEC + 1 CPU decoder processes)" in out and "at 85% headroom" in out
    assert len(stand_in) == 2 and all(s.pool_lane is not None and s.frame_format == "nv12" for s in stand_in)


def test_hybrid_needs_decoder_processes_and_a_headroom_is_checked_first(capsys: pytest.CaptureFixture[str]) -> None:
    from streamrt.cli.main import main

    assert main(["detect", "synthetic", "--hybrid"]) == 2
    err = capsys.readouterr().err
    assert "--hybrid spreads streams over NVDEC and CPU decoder processes" in err
    assert "add --decode-processes N" in err
    assert main(["detect", "synthetic", "--paced", "--headroom", "1.5"]) == 2
    assert "admission headroom must be in (0, 1], got 1.5" in capsys.readouterr().err
    assert main(["detect", "synthetic", "--cpu-decoders", "2"]) == 2
    assert "--cpu-decoders sets the CPU decoder processes of --hybrid (>= 1), got 2" in capsys.readouterr().err


def _gpu_clips() -> list[str]:
    from streamrt.video.decode_nvdec import nvdec_available

    if not nvdec_available():
        pytest.skip("needs PyNvVideoCodec and a CUDA GPU")
    clips = sorted(Path(os.environ.get("STREAMRT_VIDEO_CLIPS", "build/video-clips")).glob("*.mp4"))[:2]
    if not clips:
        pytest.skip("no clips in STREAMRT_VIDEO_CLIPS (scripts/make_video_clips.py)")
    return [str(clips[0]), str(clips[-1]), str(clips[0])]


@pytest.mark.gpu
def test_detect_with_decoder_processes_on_the_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``detect --decode-processes 2`` runs to the end on the GPU, every stream's frames in order, with detections
    (the pictures equal the in-process decoder's: test_decode_processes.py)."""
    from streamrt.cli.main import main

    paths, frames = _gpu_clips(), 40
    free = tmp_path / "free.jsonl"
    code = main(["detect", *paths, "--decode-processes", "2", "--max-frames", str(frames), "--no-progress",
                 "--jsonl", str(free)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    rows = [json.loads(line) for line in free.read_text().splitlines()]
    for i in range(len(paths)):
        assert [r["frame"] for r in rows if r["source"] == i] == list(range(frames)), f"stream {i}"
    assert sum(len(r["detections"]) for r in rows) > 0, "no detections on the generated clips' shapes"


@pytest.mark.gpu
def test_detect_hybrid_paced_on_the_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``detect --decode-processes 2 --hybrid --paced``: both sides measured, admission at the hybrid's headroom,
    every stream's frames in order."""
    from streamrt.cli.main import main

    paths, frames = _gpu_clips(), 40
    paced = tmp_path / "paced.jsonl"
    code = main(["detect", *paths, "--decode-processes", "2", "--hybrid", "--paced", "--max-frames", str(frames),
                 "--no-progress", "--jsonl", str(paced)])  # the plan the test above built, from the cache
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "nvdec+cpu" in out and "at 85% headroom" in out, out
    assert "  decode: nvdec " in out and "binding " in out, out  # the hybrid's split, in the run's summary
    rows = [json.loads(line) for line in paced.read_text().splitlines()]
    for i in range(len(paths)):
        got = [r["frame"] for r in rows if r["source"] == i]
        assert got == sorted(got) and len(got) >= frames // 2, f"stream {i}: {got}"
