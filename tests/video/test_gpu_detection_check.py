"""``scripts/gpu_detection_check.py`` on the CPU (``--device cpu --quick``): parts 1-4 run and write their
``part-<n>.md``, so a crash in the script is found here, not in a GPU call; a part that cannot run
(part 2 without torchvision) is recorded and the next parts still run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("cv2")
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_detection_check.py"


@pytest.mark.slow
def test_cpu_smoke_run_writes_every_part(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "STREAMRT_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), "--device", "cpu", "--quick", "--parts", "1,2,3,4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=280, env=env)
    has_torchvision = importlib.util.find_spec("torchvision") is not None
    assert done.returncode == (0 if has_torchvision else 1), (done.stdout + done.stderr)[-4000:]
    data = json.loads((out / "gpu_detection_check-1234.json").read_text())
    failed = data.get("failed", [])
    assert failed == ([] if has_torchvision else
                      ["2. Fixed-size NMS vs torchvision.ops.batched_nms: ModuleNotFoundError: "
                       "No module named 'torchvision'"])
    assert data["device"] == "CPU" and data["postprocess_identical"] is True and max(data["letterbox"]) < 1e-5
    ops = (out / "part-1.md").read_text()
    assert ops.count("| letterbox ") == 2 and "identical (" in ops and "not checked (no CUDA device)" in ops
    bench = (out / "part-3.md").read_text()
    assert "| (a) sync |" in bench and (out / "detection" / "detection.md").is_file()
    sweep = [line.split("|")[1:-1] for line in bench.splitlines() if line.startswith(("| 1 | 1 |", "| 2 | 2 |"))]
    assert len(sweep) == 2 and all(float(row[3]) > 0 for row in sweep), sweep  # frames were measured
    demo = (out / "part-4.md").read_text()
    assert "same detections: yes" in demo and "backend onnxruntime" in demo
    summary = (out / "gpu_detection_check.md").read_text()
    assert all(f"## {n}. " in summary for n in range(1, 5))
