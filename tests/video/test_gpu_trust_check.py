"""``scripts/gpu_trust_check.py`` on the CPU (``--device cpu --quick``): every part runs and writes its table,
so a crash in the script is found here, not in a GPU call; a part that fails is recorded and the next runs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("cv2")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_trust_check.py"


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "STREAMRT_CACHE": str(tmp_path / "cache"),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.slow
def test_cpu_smoke_run_writes_every_part(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), "--device", "cpu", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=_env(tmp_path))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = (out / "gpu_trust_check.md").read_text()
    assert "Traceback" not in report
    for n in range(1, 6):
        assert f"## {n}. " in report and (out / f"part-{n}.md").is_file()
    cameras = (out / "part-2.md").read_text()
    assert "| 0+1 | 0 (0) | ok, max 0 px / 0 |" in cameras and "| 1+0 | 0 (1) | ok, max 0 px / 0 |" in cameras
    assert "DIFFERS" not in cameras
    assert "| scene 21 640x480 | 0 | 0.50 | 0 |" in (out / "part-4.md").read_text()  # the 1.9 px box, on the CPU
    assert "3 tests collected" in (out / "part-5.md").read_text()
    data = json.loads((out / "gpu_trust_check.json").read_text())
    assert data["environment"]["device"].startswith("CPU") and "--device cpu --quick" in data["environment"]["command"]
    assert len(data["cameras"]) == 6 and "failed" not in data


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("_trust_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_trust_check"] = module
    spec.loader.exec_module(module)
    return module


def test_a_failing_part_is_recorded_and_the_next_one_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    check = _script()

    def broken(run: Any) -> list[str]:
        raise KeyError("p")  # what part 3 of gpu_video_check.py once died of

    monkeypatch.setitem(check.PARTS, "1", ("1. broken", broken))
    monkeypatch.setitem(check.PARTS, "2", ("2. fine", lambda run: ["still ran"]))
    assert check.main([str(tmp_path), "--device", "cpu", "--parts", "1,2"]) == 1
    report = (tmp_path / "gpu_trust_check.md").read_text()
    assert "KeyError: 'p'" in report and "still ran" in report
    assert json.loads((tmp_path / "gpu_trust_check.json").read_text())["failed"] == ["1. broken: KeyError: 'p'"]
    assert check.main([str(tmp_path), "--device", "cpu", "--parts", "7"]) == 2
    assert "unknown parts ['7']" in capsys.readouterr().err
