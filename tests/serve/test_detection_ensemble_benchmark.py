"""benchmarks/detection_ensemble.py in its CPU mode: the served ensemble's answers match the in-process
chain (the script refuses to time otherwise) and the table has every variant, with no errors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("cv2")
pytest.importorskip("tritonclient.grpc")
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_run_writes_one_row_per_variant(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("detection_ensemble", ROOT / "benchmarks" / "detection_ensemble.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main([str(tmp_path), "--device", "cpu", "--seconds", "1", "--concurrency", "2", "--frames", "8",
                       "--batch", "4"]) == 0
    result = json.loads((tmp_path / "detection-ensemble-cpu.json").read_text())
    variants = [row["variant"] for row in result["rows"]]
    assert len(variants) == 3 and variants[-1].startswith("served ensemble")
    assert all(row["frames"] > 0 and row["errors"] == 0 for row in result["rows"])
    assert result["meta"]["checked"] == 8
    assert "| in-process, 4 frames per call |" in (tmp_path / "detection-ensemble-cpu.md").read_text()


def test_two_stage_cpu_run_checks_the_class_scores_and_times_detect_classify(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("detection_ensemble", ROOT / "benchmarks" / "detection_ensemble.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main([str(tmp_path), "--device", "cpu", "--seconds", "1", "--concurrency", "2", "--frames", "8",
                       "--batch", "4", "--two-stage"]) == 0
    result = json.loads((tmp_path / "detection-two-stage-cpu.json").read_text())
    variants = [row["variant"] for row in result["rows"]]
    assert len(variants) == 3 and variants[-1].startswith("served ensemble detect_classify")
    assert all(row["frames"] > 0 and row["errors"] == 0 for row in result["rows"])
    assert result["meta"]["checked"] == 8 and result["meta"]["two_stage"]
    report = (tmp_path / "detection-two-stage-cpu.md").read_text()
    assert report.startswith("# Two-stage ensemble") and "class scores within 0.001" in report
