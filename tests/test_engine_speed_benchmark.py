"""``benchmarks/engine_speed.py`` on the CPU: the quick run builds, times and writes its table; the budget skips."""

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

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "engine_speed.py"


def _run(out: Path, *extra: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "# Engine speed" in done.stdout
    return json.loads((out / "engine-speed.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
def test_quick_cpu_run_builds_times_and_writes_the_table(tmp_path: Path) -> None:
    data = _run(tmp_path, "--runs", "3", "--warmup", "1")
    rows = {r["variant"]: r for r in data["rows"]}
    assert set(rows) == {"eager", "compile", "L0", "L3"}
    for variant, row in rows.items():
        assert row["ms"] > 0 and row["images_per_s"] > 0, variant
        assert row["rel_l2"] < 1e-4, variant  # fp32 on the CPU against eager fp32
        assert "roofline" not in row  # a CPU has no peak figures here
    for variant in ("compile", "L0", "L3"):
        assert rows[variant]["build_s"] > 0
    assert rows["eager"]["x_eager"] == pytest.approx(1.0)
    meta = data["meta"]
    assert meta["commit"] and meta["date"] and meta["device"].startswith("CPU")
    assert "engine_speed.py --device cpu --quick" in meta["command"]
    assert meta["models"]["tiny"]["gflop_per_image"] > 0
    text = (tmp_path / "engine-speed.md").read_text()
    assert f"- commit: {meta['commit']}" in text and "| fp32 | 1 | L3 |" in text
    assert "unknown device: no roofline column" in text


def test_budget_skips_builds_that_would_not_fit(tmp_path: Path) -> None:
    data = _run(tmp_path, "--budget", "0")
    assert {r["variant"] for r in data["rows"]} == {"eager", "compile", "L0", "L3"}
    assert all(r["notes"].startswith("skipped: budget") and "ms" not in r for r in data["rows"])


def test_one_batch_runs_whole_before_the_next_cheap_variants_first() -> None:
    spec = importlib.util.spec_from_file_location("_engine_speed", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_engine_speed"] = module
    spec.loader.exec_module(module)
    tasks = module.tasks_in_order(["resnet50"], ["fp16"], [32, 1], ["eager", "compile", "max-autotune", "L0", "L3",
                                                                    "L5"])
    order = [(t.batch, t.variant) for t in tasks]
    assert order[:6] == [(32, "eager"), (32, "compile"), (32, "L0"), (32, "L3"), (32, "max-autotune"), (32, "L5")]
    assert order[6:] == [(1, v) for _, v in order[:6]]
    assert module.PAIRS["L5"] == "max-autotune" and module.PAIRS["L3"] == "compile"
