"""``scripts/gpu_serving_check.py`` on the CPU (``--device cpu --quick``): both parts run against the real
server and write their rows, so a crash in the script (a renamed return type, a KeyError while
formatting a failure) is found here, not in an H200 call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_serving_check.py"
SMALL = ["--device", "cpu", "--quick", "--seconds", "1", "--concurrency", "2", "--processes", "1"]


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    env = {**os.environ, "STREAMRT_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "out"), *SMALL, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=280, env=env)
    report = (tmp_path / "out" / "serving-cpu.md").read_text()
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in report.splitlines()
            if line.startswith("| ") and "---" not in line]
    return done, rows


@pytest.mark.slow
def test_front_end_part_writes_a_row_per_protocol(tmp_path: Path) -> None:
    done, rows = _run(tmp_path, "--models", "")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    body = {r[0]: r for r in rows if r[0] in ("grpc", "http")}
    assert set(body) == {"grpc", "http"}
    for row in body.values():
        assert row[1] == "null_small x1" and row[2] == "64" and float(row[3].replace(",", "")) > 0, row
        assert float(row[6]) >= float(row[5]) > 0 and row[-1] == "0", row


@pytest.mark.slow
def test_model_part_builds_measures_offline_and_records_the_failing_variant(tmp_path: Path) -> None:
    """The plan is built by the script's own ``build_plan`` (the BuildResult crash of 2026-12-01); CUDA shared
    memory cannot work on the CPU and must become a failed row while the other variants keep theirs."""
    done, rows = _run(tmp_path, "--skip-frontend", "--max-batch", "4", "--request-batch", "2", "--instances", "1")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert (tmp_path / "out" / "plans" / "tiny.plan").is_file()
    body = {r[1].split(",")[0] if "offline" in r[1] else r[1].split(", ")[1]: r for r in rows if r[0] == "tiny fp32"}
    assert set(body) == {"engine offline", "gRPC binary", "gRPC + system shm", "gRPC + CUDA shm"}, rows
    assert float(body["engine offline"][2].replace(",", "")) > 0
    for label in ("gRPC binary", "gRPC + system shm"):
        row = body[label]
        assert float(row[2].replace(",", "")) > 0 and row[3].endswith("%") and row[-1].startswith("0 errors"), row
    assert body["gRPC + CUDA shm"][2] == "failed" and "cuda" in body["gRPC + CUDA shm"][-1].lower()


def test_a_model_that_fails_to_build_is_a_row_and_the_report_is_finished(tmp_path: Path) -> None:
    done, rows = _run(tmp_path, "--skip-frontend", "--models", "no_such_net")
    assert done.returncode == 1, (done.stdout + done.stderr)[-4000:]
    assert rows[-1][:2] == ["no_such_net", "failed"] and "Error" in rows[-1][-1], rows
    report = (tmp_path / "out" / "serving-cpu.md").read_text()
    assert "- system shm >= 70% of offline" in report and "Failed parts: (b) no_such_net." in report
