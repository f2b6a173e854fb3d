"""Detection over several GPUs: parsing ``--gpus``, dealing cameras round-robin, and the per-GPU runs
(threads, barrier, source indices mapped back, reports summed). On the CPU the "GPUs" are host devices
(the ``enter`` hook), so all of that runs here; the GPU tests run one GPU, and two where two are visible."""

from __future__ import annotations

from typing import Any

import pytest

from streamrt.device import CpuDevice
from streamrt.device.base import Device
from streamrt.errors import ConfigError
from streamrt.video import DetectConfig, Detections, Frame, SyntheticClip, SyntheticSource, run_detection
from streamrt.video.multi_gpu import deal_sources, parse_gpus, run_detection_on_gpus

CLIP = {"width": 320, "height": 192, "frames": 6}


def test_parse_gpus() -> None:
    assert parse_gpus("0,1", 2) == [0, 1] and parse_gpus("1", 2) == [1]
    with pytest.raises(ConfigError, match=r"names GPU 2, which does not exist; torch sees GPUs 0\.\.1"):
        parse_gpus("0,2", 2)
    with pytest.raises(ConfigError, match="torch sees no GPU"):
        parse_gpus("0", 0)
    with pytest.raises(ConfigError, match="lists a GPU twice"):
        parse_gpus("1,1", 2)
    with pytest.raises(ConfigError, match="indices separated by commas"):
        parse_gpus("a,b", 2)
    with pytest.raises(ConfigError, match="names no GPU"):
        parse_gpus(",", 2)


def test_deal_sources_round_robin() -> None:
    assert deal_sources(4, [0, 1]) == {0: [0, 2], 1: [1, 3]}
    assert deal_sources(1, [0, 1]) == {0: [0]}  # a GPU without a camera is not used
    assert deal_sources(3, [1, 0]) == {1: [0, 2], 0: [1]}


def test_runs_per_gpu_map_sources_back_and_add_up(detector: Any) -> None:
    clips = [SyntheticClip(**CLIP, seed=s) for s in range(3)]
    entered: list[int] = []

    def enter(gpu: int) -> Device:
        entered.append(gpu)
        return CpuDevice()

    seen: list[tuple[int, int]] = []

    def keep(frame: Frame, det: Detections) -> None:
        assert frame.source == det.source
        seen.append((det.source, det.index))

    report = run_detection_on_gpus(lambda: detector, [SyntheticSource(c) for c in clips], DetectConfig(),
                                   gpus=[0, 1], on_result=keep, enter=enter)
    assert sorted(entered) == [0, 1]
    assert report.sources == {0: [0, 2], 1: [1]}
    assert report.runs[0].sources == 2 and report.runs[1].sources == 1
    assert report.frames == 3 * CLIP["frames"] == len(seen)
    for source in range(3):  # every frame of every camera, in order per camera, under its own index
        assert [i for s, i in seen if s == source] == list(range(CLIP["frames"]))
    assert report.fps == pytest.approx(report.frames / report.wall_s)
    assert "2 GPUs:" in report.format_text() and report.to_dict()["sources"] == {"0": [0, 2], "1": [1]}
    # The same detections as one run over all cameras on one device.
    alone: dict[tuple[int, int], int] = {}
    run_detection(detector, [SyntheticSource(c) for c in clips], DetectConfig(),
                  on_result=lambda f, d: alone.__setitem__((d.source, d.index), len(d)))
    assert len(alone) == len(seen)


def test_a_gpu_that_fails_to_open_fails_the_run(detector: Any) -> None:
    def enter(gpu: int) -> Device:
        if gpu == 1:
            raise ConfigError("GPU 1 is broken")
        return CpuDevice()

    sources = [SyntheticSource(SyntheticClip(**CLIP, seed=s)) for s in range(2)]
    with pytest.raises(ConfigError, match="GPU 1 is broken"):
        run_detection_on_gpus(lambda: detector, sources, DetectConfig(), gpus=[0, 1], enter=enter, timeout_s=60)


def _gpu_count() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _gpu_detector() -> Any:
    from streamrt.video.model import best_backend, bundled_model, open_detector

    return open_detector(bundled_model(), backend=best_backend(), max_batch=4)


@pytest.mark.gpu
def test_one_gpu_explicitly() -> None:
    clips = [SyntheticClip(**CLIP, seed=s) for s in range(2)]
    report = run_detection_on_gpus(_gpu_detector, [SyntheticSource(c) for c in clips], DetectConfig(), gpus=[0])
    assert report.frames == 2 * CLIP["frames"] and report.runs[0].device == "cuda"


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_count() < 2, reason="needs 2 CUDA GPUs (torch.cuda.device_count() < 2)")
def test_two_gpus_each_run_their_cameras_on_their_own_device() -> None:
    import torch

    where: dict[int, set[int]] = {0: set(), 1: set()}
    opened: list[Any] = []

    def open_and_record() -> Any:
        model = _gpu_detector()
        opened.append((torch.cuda.current_device(), model))
        return model

    seen: list[tuple[int, int]] = []
    clips = [SyntheticClip(**CLIP, seed=s) for s in range(4)]
    report = run_detection_on_gpus(open_and_record, [SyntheticSource(c) for c in clips], DetectConfig(),
                                   gpus=[0, 1], on_result=lambda f, d: seen.append((d.source, d.index)))
    for gpu, model in opened:
        where[gpu].add(id(model.engine))
    assert sorted(g for g, _ in opened) == [0, 1] and not (where[0] & where[1])  # an engine per GPU
    assert report.sources == {0: [0, 2], 1: [1, 3]} and report.frames == 4 * CLIP["frames"] == len(seen)
    assert all(r.device == "cuda" and r.frames == 2 * CLIP["frames"] for r in report.runs.values())


def test_cli_gpus_that_do_not_exist_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from streamrt.cli.main import main

    missing = _gpu_count()
    assert main(["detect", "synthetic:96x64x2", "--no-progress", "--gpus", str(missing)]) == 2
    assert f"names GPU {missing}, which does not exist" in capsys.readouterr().err


@pytest.mark.gpu
def test_cli_gpus_zero_writes_jsonl_and_reports(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from streamrt.cli.main import main

    dets = tmp_path / "d.jsonl"
    assert main(["detect", "synthetic:320x192x6", "synthetic:320x192x6:seed=5", "--no-progress", "--gpus", "0",
                 "--jsonl", str(dets), "--report", str(tmp_path / "report")]) == 0
    records = [json.loads(line) for line in dets.read_text().splitlines()]
    assert sorted({r["source"] for r in records}) == [0, 1] and len(records) == 12
    assert (tmp_path / "report" / "detect_gpus.json").is_file()
    assert "1 GPUs:" in capsys.readouterr().out


def test_two_gpu_runbook_refuses_with_fewer_than_two_gpus(tmp_path: Any) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if _gpu_count() >= 2:
        pytest.skip("two GPUs are visible: the runbook would run")
    out = subprocess.run([sys.executable, str(root / "scripts" / "gpu_multi_check.py"), str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert f"needs 2 CUDA GPUs, torch sees {_gpu_count()}" in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("part", ["serve", "detect"])
def test_two_gpu_runbook_cpu_smoke_run_writes_every_row(tmp_path: Any, part: str) -> None:
    """``--device cpu --quick``: the runbook's builds, perf runs, detect runs, rows and verdicts, on the CPU."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "STREAMRT_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(root / "scripts" / "gpu_multi_check.py"), str(out), "--device", "cpu", "--quick",
         "--parts", part, "--seconds", "1", "--concurrency", "2", "--processes", "1", "--frontend-processes", "1",
         "--instances", "1", "--request-batch", "2", "--streams", "2", "--frames", "8"],
        capture_output=True, text=True, timeout=280, env=env, cwd=root)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = (out / "multigpu.md").read_text()
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in report.splitlines()
            if line.startswith("| ") and "---" not in line]
    if part == "serve":
        body = {(r[0].split(" (")[0], r[1]): r for r in rows[1:]}
        assert set(body) == {(g, t) for g in ("gpus [0]", "gpus [0, 1]") for t in ("gRPC binary", "gRPC + system shm")}
        assert all(float(r[2].replace(",", "")) > 0 and r[-1] == "0 errors" for r in body.values()), rows
        assert report.count("- server, gRPC") == 2
    else:
        body = {r[0]: r for r in rows[1:]}
        assert len(body) == 3 and all(r[2] == "16" and float(r[3].replace(",", "")) > 0 for r in body.values()), rows
        assert report.count("- detection, two GPUs") == 2
