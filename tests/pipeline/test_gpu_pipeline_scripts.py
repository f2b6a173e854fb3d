"""``scripts/gpu_pipeline_check.py`` and ``scripts/gpu_pipeline_plan.py`` on the CPU (``--device cpu``, tiny
frames and model): the H200 call's command line and its reports, found broken here rather than there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--frame-size", "64x36", "--size", "32", "--items", "6", "--warmup", "2", "--rounds", "1",
        "--warmup-rounds", "0", "--trace-items", "6", "--workers", "2", "--distinct-frames", "3", "--verify", "4"]


def _run(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STREAMRT_CACHE": str(tmp_path / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=280, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


def _check_report(out: Path) -> None:
    report = (out / "pipeline_bench.md").read_text()
    for case in ("(a) sync", "(b) streams ring4", "(c) single x2 ring4", "(b+c) streams x2 ring4"):
        assert f"| {case} |" in report, report
    assert "bit-identical in every case" in report
    data = json.loads((out / "pipeline_bench.json").read_text())
    assert data and (out / "traces").is_dir() and (out / "timelines").is_dir()


@pytest.mark.slow
def test_pipeline_check_cpu_smoke_run_writes_the_report(tmp_path: Path) -> None:
    done = _run(tmp_path, "gpu_pipeline_check.py", str(tmp_path / "out"), "--device", "cpu", *TINY)
    assert "device CPU" in done.stdout
    _check_report(tmp_path / "out")


@pytest.mark.slow
def test_pipeline_plan_builds_a_plan_the_check_runs(tmp_path: Path) -> None:
    plan = tmp_path / "tiny.plan"
    done = _run(tmp_path, "gpu_pipeline_plan.py", str(plan), "--device", "cpu", "--size", "32", "--precision", "fp32")
    assert plan.exists() and "torch_inductor fp32, input 1x3x32x32" in done.stdout
    _run(tmp_path, "gpu_pipeline_check.py", str(tmp_path / "out"), "--device", "cpu", "--plan", str(plan), *TINY)
    _check_report(tmp_path / "out")
