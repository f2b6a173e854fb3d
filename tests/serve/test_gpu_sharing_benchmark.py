"""benchmarks/gpu_sharing.py in its CPU mode (ONNX Runtime, tiny models): it runs end to end against the
real server and writes a table with a row per model and scenario."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_sharing_benchmark_cpu_mode_writes_a_row_per_model(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_sharing.py"), str(out), "--device", "cpu", "--seconds", "2",
         "--warmup", "0.5", "--concurrency", "2", "--cache-dir", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=280, env=env, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (out / "gpu-sharing-cpu.md").read_text()
    rows = [line.split("|")[1:-1] for line in report.splitlines() if line.startswith("| ") and "---" not in line]
    header, body = [c.strip() for c in rows[0]], [[c.strip() for c in r] for r in rows[1:]]
    assert header == ["scenario", "model", "input", "priority", "infer/s", "images/s", "p50 ms", "p99 ms", "errors",
                      "GPU util %"]
    seen = {(r[0], r[1]) for r in body}
    assert seen == {(s, m) for s in ("no priorities", "priorities") for m in ("large", "medium", "small")}
    for row in body:
        assert float(row[4]) == float(row[5]) > 0 and float(row[7]) >= float(row[6]) > 0 and row[8] == "0", row
    assert {r[1]: r[3] for r in body if r[0] == "priorities"} == {"large": "4", "medium": "1", "small": "2"}
