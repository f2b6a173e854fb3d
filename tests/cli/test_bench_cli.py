"""`streamrt bench`: report, JSON, export-times, shapes and batch, inputs files, errors (exit 2, one line)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import catalogue_file
from streamrt.cli.main import main

PROFILE = ["--min-shapes", "x:1x3x32x32", "--opt-shapes", "x:2x3x32x32", "--max-shapes", "x:8x3x32x32"]
FAST = ["--warmup", "5", "--iterations", "5"]


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    return catalogue_file("small_cnn", tmp_path)


def _bench(model: Path, *extra: str) -> list[str]:
    return ["bench", str(model), *PROFILE, "--cache-dir", str(model.parent / "cache"), *extra]


def test_bench_onnx_built_on_the_fly(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_bench(model, "--warmup", "10", "--duration", "0.2", "--batch", "4")]) == 0
    out = capsys.readouterr().out
    assert "=== Performance summary ===" in out
    assert "Shapes: x=4x3x32x32 (batch 4)" in out and "items/s (batch 4)" in out
    assert "H2D Latency: 0 ms (zero-length: CPU engine" in out
    assert "Inputs: random normal (seed 0)" in out
    for metric in ("Latency:", "Enqueue Time:", "CPU Compute Time:", "D2H Latency:", "Total Host Walltime:"):
        assert metric in out


def test_default_shapes_are_the_profile_opt_shapes(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_bench(model, *FAST, "--json")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["shapes"] == {"x": [2, 3, 32, 32]} and data["summary"]["batch"] == 2
    assert data["summary"]["queries"] == 5 and data["device"] == "cpu"
    assert set(data["summary"]["compute_ms"]) >= {"min", "max", "mean", "median", "p90", "p95", "p99", "cov"}
    assert data["summary"]["throughput_items_per_s"] == pytest.approx(2 * data["summary"]["throughput_qps"])


def test_shapes_flag_and_export_times(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    times = tmp_path / "times.json"
    assert main([*_bench(model, *FAST, "--shapes", "x:3x3x32x32", "--export-times", str(times))]) == 0
    captured = capsys.readouterr()
    assert "x=3x3x32x32 (batch 3)" in captured.out and "per-query times" in captured.err
    records = json.loads(times.read_text())
    assert len(records) == 5 and set(records[0]) >= {"startEnqMs", "endEnqMs", "startH2dMs", "latencyMs"}


def test_bench_a_plan_with_inputs_file(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "cnn.plan"
    assert main(["build", str(model), "-o", str(plan), *PROFILE, "--cache-dir", str(tmp_path / "c")]) == 0
    x = np.random.default_rng(0).standard_normal((5, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    capsys.readouterr()
    assert main(["bench", str(plan), *FAST, "--inputs", str(tmp_path / "in.npz")]) == 0
    out = capsys.readouterr().out
    assert f"Engine: {plan}" in out and "x=5x3x32x32 (batch 5)" in out and "from " in out


@pytest.mark.parametrize(
    ("arrays", "extra", "match"),
    [
        ({"images": np.ones((1, 3, 32, 32), np.float32)}, [], "images"),
        ({"x": np.ones((1, 3, 32, 32), np.float64)}, [], "dtype float64"),
        ({"x": np.ones((1, 3, 32, 32), np.float32)}, ["--batch", "2"], "--inputs fixes the shapes"),
        (None, ["--shapes", "x:9x3x32x32"], "outside every profile"),
        (None, ["--batch", "0"], "batch must be"),
        (None, ["--shapes", "y:1x3x32x32"], "'y'"),
    ],
)
def test_bad_inputs_exit_2_with_one_line(
    model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    arrays: dict | None,
    extra: list[str],
    match: str,
) -> None:
    args = _bench(model, *FAST, *extra)
    if arrays is not None:
        np.savez(tmp_path / "bad.npz", **arrays)
        args += ["--inputs", str(tmp_path / "bad.npz")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("streamrt bench: error:") and match in err[-1]
    assert not any("Traceback" in line for line in err)


def test_console_script_runs_bench(model: Path) -> None:
    script = Path(sys.executable).parent / "streamrt"
    if not script.exists():
        pytest.skip("the streamrt console script is not installed next to this interpreter")
    proc = subprocess.run(
        [str(script), *_bench(model, "--warmup", "0", "--iterations", "3", "--json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["summary"]["queries"] == 3
