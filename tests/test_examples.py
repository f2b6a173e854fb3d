"""Every script of examples/ runs on the CPU at its small size and writes its figure or file.

The examples are the course (docs: examples/README.md); a GPU run of the same scripts is
``scripts/gpu_examples.sh`` (``--device cuda``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py"))
# What each example must leave in its output folder.
PRODUCES = {
    "01": "batch_sweep.png", "02": "precision.png", "03": "compat.txt", "04": "timeline.png", "05": "copies.png",
    "06": "pipeline_timeline.png", "07": "graphs.png", "08": "profile.png", "09": "errors.md", "10": "serving.png",
    "11": "realtime.png",
}

pytest.importorskip("torch")
pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("examples-cache")  # shared: the examples reuse each other's builds


def test_the_course_is_complete() -> None:
    assert [p.name[:2] for p in EXAMPLES] == list(PRODUCES)
    readme = (ROOT / "examples" / "README.md").read_text()
    assert all(p.name in readme for p in EXAMPLES)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_on_the_cpu(script: Path, tmp_path: Path, cache: Path) -> None:
    if script.stem.startswith("11_"):
        pytest.importorskip("cv2")
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))  # keep carried packages
    env = {**os.environ, "PYTHONPATH": path, "STREAMRT_CACHE": str(cache), "MPLBACKEND": "Agg",
           "STREAMRT_EXAMPLES_SMALL": "1"}
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(script), "--device", "cpu", "--out", str(out)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    produced = out / PRODUCES[script.stem[:2]]
    assert produced.stat().st_size > 0, f"{script.name} did not write {produced.name}"
    assert "Traceback" not in proc.stderr
    if script.stem.startswith("08_"):
        reading_matches_the_table(proc.stdout)


def reading_matches_the_table(stdout: str) -> None:
    """Example 08's "reading it" figures are those of the bench table it printed, not of another run."""
    table = re.search(r"^Latency: .*?max = ([\d.]+) ms, mean = ([\d.]+) ms, median = ([\d.]+) ms.*"
                      r"percentile\(99%\) = ([\d.]+) ms", stdout, re.M)
    reading = re.search(r"- median ([\d.]+) ms .* mean ([\d.]+) ms .*\(max ([\d.]+) ms\)\n- p99 ([\d.]+) ms", stdout)
    assert table and reading, stdout[-3000:]
    (t_max, t_mean, t_median, t_p99), (r_median, r_mean, r_max, r_p99) = (
        [float(v) for v in table.groups()], [float(v) for v in reading.groups()])
    for name, shown, printed, digits in (("median", r_median, t_median, 3), ("mean", r_mean, t_mean, 3),
                                         ("max", r_max, t_max, 2), ("p99", r_p99, t_p99, 3)):
        assert abs(shown - printed) <= 0.6 * 10 ** -digits, (name, shown, printed)
