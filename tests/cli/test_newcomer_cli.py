"""What a newcomer meets first: pipeline-bench without torch, the noise rule in demo and pipeline-bench."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_NO_TORCH = """
import sys
sys.modules["torch"] = None  # what `import torch` does on a machine without it: ImportError
from streamrt.cli.main import main
raise SystemExit(main(["pipeline-bench", "--device", "cpu"]))
"""


def test_pipeline_bench_without_torch_is_one_line_with_the_cpu_pin() -> None:
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))  # keep carried packages
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "'torch' is required" in lines[0]
    assert "on a CPU-only machine: pip install torch==2.13.0" in lines[0]  # the README's wording


@pytest.mark.timeout(300)
def test_pipeline_bench_reports_spread_and_never_a_ratio_on_an_unstable_baseline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("torch")
    from streamrt.cli.main import main

    rc = main(["pipeline-bench", "--device", "cpu", "--items", "6", "--warmup", "1", "--rounds", "3",
               "--warmup-rounds", "0", "--trace-items", "4", "--workers", "2", "--size", "64",
               "--frame-size", "160x120", "--verify", "0"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| spread (CoV) |" in out
    rows = [line for line in out.splitlines() if line.startswith("| (")]
    assert len(rows) == 4
    for row in rows:  # "vs base" is a ratio only when the baseline rounds were steady
        vs_base = row.split("|")[3].strip()
        assert vs_base == "baseline unstable" or vs_base.endswith("x")
    if "baseline unstable" in rows[0]:
        assert "no ratio: the synchronous baseline" in out and "warning: the machine was noisy" in out


def test_detect_default_topology_is_the_demos_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("cv2")
    from streamrt.cli.main import main
    from streamrt.device import cuda_available
    from streamrt.video.tuning import default_pipeline

    cache = tmp_path / "cache"
    rc = main(["detect", "synthetic:160x96x20", "--backend", "onnxruntime", "--cache-dir", str(cache),
               "--no-progress", "--jsonl", str(tmp_path / "d.jsonl")])
    assert rc == 0
    out = capsys.readouterr().out
    expected = default_pipeline(cuda_available()).describe()
    assert out.splitlines()[0].startswith(f"{expected}: 20 frames"), out
    assert "throughput per window: median of 5 windows" in out
    rc = main(["detect", "synthetic:160x96x20", "--backend", "onnxruntime", "--cache-dir", str(cache),
               "--no-progress", "--topology", "sync"])
    assert rc == 0 and capsys.readouterr().out.startswith("sync")  # explicit flags still win


def test_window_rates_skip_the_fill_time() -> None:
    from streamrt.video.runner import window_rates

    done = [10.0 + 0.01 * i for i in range(50)]  # first frame late (fill), then 100 FPS steady
    rates = window_rates(done)
    assert len(rates) == 5 and all(r == pytest.approx(100.0) for r in rates)
    assert window_rates(done[:9]) == []
