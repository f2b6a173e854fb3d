"""``scripts/gpu_video_check.py`` on the CPU (``--device cpu --quick``, a CPU decoder standing in for NVDEC):
every part runs, so a crash in the script is found here and not in a GPU call; a decoder pool that cannot
open fails its row only (part 3 once died of ``KeyError: 'p'`` in its own clean-up after the pool failed,
and the CPU and raw-frame rows were never measured)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("cv2")
pytest.importorskip("av")  # the smoke clips are encoded with PyAV

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_video_check.py"


@pytest.mark.slow
def test_cpu_smoke_run_runs_every_part(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "STREAMRT_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), "--device", "cpu", "--quick",
                           "--clips", str(tmp_path / "none")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = (out / "gpu_video_check.md").read_text()
    assert "Traceback" not in report and "FAILED" not in report
    for n in range(1, 7):
        assert f"## {n}. " in report
    assert "| GPU decode (CPU stand-in for NVDEC (OpenCV)) |" in report and "| raw frames (pre-decoded" in report
    data = json.loads((out / "gpu_video_check.json").read_text())
    assert len(data["paths"]) == 3 and "failed" not in data
    assert [r["reader"] for r in data["sweep"]] == ["auto", "before", "auto"]  # --quick: the old way beside at 2


def test_cpu_smoke_run_of_the_gil_reader_a_given_nvdec_bound_hybrid_count_and_runners(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "STREAMRT_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), "--device", "cpu", "--quick", "--parts", "2,4,5",
                           "--clips", str(tmp_path / "none"), "--baselines", "gil0.5", "--nvdec-bound", "100",
                           "--hybrid-streams", "2", "--aoti-runners", "torch,nogil"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    data = json.loads((out / "gpu_video_check.json").read_text())
    assert [r["reader"] for r in data["sweep"]] == ["auto", "gil0.5", "auto"]
    assert data["environment"]["NVDEC bound"].startswith("100 frames/s")
    assert len(data["hybrid"]["frames"]) == 2  # --hybrid-streams, not the sweep's first unsustained count
    both = data["hybrid_capacity"]  # the plan's capacities: both sides decoding at once, at the plan's count
    assert both["nvdec"] > 0 and both["cpu"] > 0 and both["first"]["nvdec_sessions"] == 1, both
    assert both["planned_nvdec"] == both["nvdec_sessions"] == 2, both  # the 2 streams fit: measured again with 2
    assert data["fair_torch"] and data["fair_nogil"] and "failed" not in data  # part 4 once per runner


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("_video_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_video_check"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return _script()._smoke_clips(tmp_path_factory.mktemp("clips"))  # type: ignore[no-any-return]


def test_a_decoder_pool_that_cannot_open_fails_its_row_only(clips: list[Path], monkeypatch: pytest.MonkeyPatch,
                                                             detector: Any) -> None:
    check = _script()
    dec = check.Decoders("cpu", quick=True)
    opened = dec.pool

    def pool(paths: list[Path], **kwargs: Any) -> Any:
        if len(paths) >= 3:
            raise RuntimeError("cuvidCreateDecoder(&hDecoder, &videoDecodeCreateInfo) returned error 2")
        return opened(paths, **kwargs)

    monkeypatch.setattr(dec, "pool", pool)
    state: dict[str, Any] = {"detector": detector, "detector_s": 0.0}
    lines = check.part_paths(clips, 3, 6, state, dec)  # the GPU row fails, the CPU and raw rows are measured
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| path")]
    assert len(rows) == 3 and "FAILED: RuntimeError: cuvidCreateDecoder" in rows[0]
    assert "FAILED" not in rows[1] + rows[2] and len(state["paths"]) == 2
    sweep = check.part_sweep(clips, [3, 2], 0.3, 1, state, check.Budget(600), dec)
    assert sum("FAILED" in line for line in sweep) == 1 and len(state["sweep"]) == 1  # after the failure: next point
    assert [f.split(":")[0] for f in state["failed"]] == ["part 3 GPU decode (CPU stand-in for NVDEC (OpenCV))",
                                                          "part 2 3 | auto"]


def test_the_hybrid_run_is_admitted_against_the_hybrid_capacity_not_nvdec_alone(detector: Any) -> None:
    """Part 5 passes the capacity both sides gave at once to the admission record: its line and ``fit`` name that
    capacity, not part 1's NVDEC bound (on the H100 on 2026-12-06 the record said NVDEC 5,134 and 154 fit)."""
    check = _script()
    info = SimpleNamespace(width=1920, height=1080)
    sources = [SimpleNamespace(info=info)] * 12
    state: dict[str, Any] = {"nvdec_bound_fps": 150.0, "engine_fps_batch4": 1e6}
    plan, fit = check._admission(detector, sources, 4, state, "off", True, decode=("nvdec+cpu", 300.0))
    assert fit == 9 and "300 frames/s (nvdec+cpu, h264 1920x1080)" in plan.message, plan.message
    plan, fit = check._admission(detector, sources, 4, state, "off", True)  # without: part 1's bound
    assert fit == 4 and "150 frames/s" in plan.message, plan.message
