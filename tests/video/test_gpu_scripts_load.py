"""The GPU scripts load their benchmark modules on the CPU exactly as they do on the GPU machine.

``scripts/gpu_detection_check.py --parts 3`` once failed before measuring anything: it executed
``benchmarks/detection.py`` without registering it in ``sys.modules``, and ``dataclass`` looks a
class's module up there. These tests import the scripts and call their loaders.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str) -> Any:
    module_name = f"_test_{name}"
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def test_detection_check_loads_the_benchmark_with_its_dataclasses() -> None:
    check = _script("gpu_detection_check")
    bench = check._load_benchmark()
    assert sys.modules["detection_bench"] is bench
    assert dataclasses.is_dataclass(bench.Case)
    names = [case.name for case in bench.cases(False, [2])]
    assert names[0] == "(a) sync" and "(b) streams" in names
    assert check._load_benchmark() is bench  # loaded once


def test_load_script_unregisters_a_module_that_fails(tmp_path: Path) -> None:
    check = _script("gpu_detection_check")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(RuntimeError, match="boom"):
        check.load_script(broken, "_broken_bench")
    assert "_broken_bench" not in sys.modules
