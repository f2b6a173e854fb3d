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


def _module() -> Any:
    if "_engine_speed" in sys.modules:
        return sys.modules["_engine_speed"]
    spec = importlib.util.spec_from_file_location("_engine_speed", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_engine_speed"] = module
    spec.loader.exec_module(module)
    return module


def test_one_batch_runs_whole_before_the_next_cheap_variants_first() -> None:
    module = _module()
    tasks = module.tasks_in_order(["resnet50"], ["fp16"], [32, 1], ["eager", "compile", "max-autotune", "L0", "L3",
                                                                    "L5"])
    order = [(t.batch, t.variant) for t in tasks]
    assert order[:6] == [(32, "eager"), (32, "L0"), (32, "L3"), (32, "compile"), (32, "L5"), (32, "max-autotune")]
    assert order[6:] == [(1, v) for _, v in order[:6]]
    assert module.PAIRS["L5"] == "max-autotune" and module.PAIRS["L3"] == "compile"


def test_merge_puts_two_runs_in_one_table(tmp_path: Path) -> None:
    module = _module()
    meta = {"device_kind": "cuda", "device": "NVIDIA H200", "date": "2026-12-01 15:00 UTC", "commit": "abc",
            "torch": "2.11", "cuda": "13.0", "python": "3.12", "cudnn_benchmark": True, "budget_s": 450.0,
            "spent_s": 400.0, "peaks": None, "models": {"resnet50": {"source": "torchvision resnet50",
                                                                    "input": [3, 224, 224], "gflop_per_image": 8.2}}}
    first = {"meta": {**meta, "command": "python benchmarks/engine_speed.py --levels 0"},
             "rows": [{"model": "resnet50", "precision": "fp16", "batch": 32, "variant": "eager", "ms": 4.0}]}
    second = {"meta": {**meta, "command": "python benchmarks/engine_speed.py --levels 5", "commit": "def"},
              "rows": [{"model": "resnet50", "precision": "fp16", "batch": 32, "variant": "L5", "ms": 2.0,
                        "graphs": True}]}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, data in zip(paths, (first, second), strict=True):
        path.write_text(json.dumps(data))
    assert module.main(["--merge", *map(str, paths), "--out", str(tmp_path / "merged")]) == 0
    text = (tmp_path / "merged" / "engine-speed.md").read_text()
    assert "--levels 0 ; python benchmarks/engine_speed.py --levels 5" in text and "abc / def" in text
    assert "| fp16 | 32 | L5 | yes |  | 2.000 |  | 2.00 |" in text  # x eager across the two runs
