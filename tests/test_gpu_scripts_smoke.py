"""The small GPU scripts on the CPU (``scripts/gpu_aoti_diagnose.py --device cpu``) and the helper that lets a
GPU script's parts fail on their own (``scripts/_gpu_parts.py``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]


def _parts() -> Any:
    spec = importlib.util.spec_from_file_location("_gpu_parts_under_test", ROOT / "scripts" / "_gpu_parts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_failing_part_is_a_line_and_the_next_part_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _parts().Report(tmp_path / "r" / "check.md", ["# check", ""])
    assert (tmp_path / "r" / "check.md").read_text() == "# check\n\n"  # written before any part runs
    with report.part("(a) first"):
        report.add(["| a | 1 |"])
    assert "| a | 1 |" in (tmp_path / "r" / "check.md").read_text()  # written as it comes
    with report.part("(b) crashes"):
        {"present": 1}["absent"]  # the KeyError-in-error-handling kind of bug
    with report.part("(c) gives up"):
        raise SystemExit("server not ready after 300 s | exit 1")
    with report.part("(d) last"):
        report.add(["| d | 4 |"])
    assert report.exit_status() == 1
    text = (tmp_path / "r" / "check.md").read_text()
    assert "**(b) crashes: FAILED** (KeyError: 'absent')" in text
    assert "**(c) gives up: FAILED** (SystemExit: server not ready after 300 s / exit 1)" in text  # no table break
    assert text.index("| a | 1 |") < text.index("(b) crashes") < text.index("| d | 4 |")
    assert text.rstrip().endswith("Failed parts: (b) crashes, (c) gives up.")
    assert "Traceback" in capsys.readouterr().err and "Traceback" not in text


def test_every_part_running_is_exit_status_zero(tmp_path: Path) -> None:
    report = _parts().Report(tmp_path / "check.md", [])
    with report.part("only"):
        report.add(["ok"])
    assert report.exit_status() == 0 and "Failed parts" not in (tmp_path / "check.md").read_text()


def test_keyboard_interrupt_still_stops_the_script(tmp_path: Path) -> None:
    report = _parts().Report(tmp_path / "check.md", [])
    with pytest.raises(KeyboardInterrupt), report.part("interrupted"):
        raise KeyboardInterrupt


@pytest.mark.slow
def test_aoti_diagnose_cpu_smoke_run_loads_the_package_in_every_mode(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_aoti_diagnose.py"), str(tmp_path / "out"),
                           "--device", "cpu"], cwd=ROOT, capture_output=True, text=True, timeout=280, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert (tmp_path / "out" / "tiny.pt2").is_file()
    assert done.stdout.count("ran ok (4, 16)") == 3
    assert "summary: plain rc=0, onnxruntime_first rc=0, ensure_cxx_runtime rc=0" in done.stdout
    assert "package needs:" in done.stdout and "FAILED" not in done.stdout


@pytest.mark.torch
def test_plan_sources_writes_each_profiles_wrapper_with_its_commented_launches(tmp_path: Path) -> None:
    """``scripts/plan_sources.py`` (the H200 profile step) over a tiny CPU plan: the wrapper C++ names the
    ATen ops of each launch; a missing plan is a line and exit status 1, the other plans still written."""
    torch = pytest.importorskip("torch")
    import streamrt
    from streamrt.config import BuildConfig

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 1)).eval()
    config = BuildConfig(backend="torch_inductor", optimization_level=0, backend_options={"device": "cpu"})
    streamrt.build_module(net, [torch.randn(1, 3, 8, 8)], tmp_path / "tiny.plan", config)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "plan_sources.py"), str(tmp_path / "missing.plan"),
                           str(tmp_path / "tiny.plan"), "--out", str(tmp_path / "src")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and "missing.plan: plan file not found" in done.stderr, done.stderr
    wrapper = (tmp_path / "src" / "tiny-p0.wrapper.cpp").read_text()
    assert "Original ATen: [aten.convolution]" in wrapper
    assert "commented launches" in done.stdout


@pytest.mark.torch
def test_cudnn_first_call_cpu_smoke_run_writes_a_line_per_mode(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import json

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_cudnn_first_call.py"), str(tmp_path),
                           "--device", "cpu", "--modes", "default,heur_b"], capture_output=True, text=True,
                          timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in (tmp_path / "cudnn-first-call.jsonl").read_text().splitlines()]
    assert [line["mode"] for line in lines] == ["default", "heur_b"]
    assert all("error" not in line and len(line["rows"]) == 19 for line in lines)
    assert "| **total** |" in done.stdout


@pytest.mark.slow
def test_rebuild_check_cpu_smoke_run_writes_three_rows_and_the_template_diff(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_rebuild_check.py"), str(tmp_path / "out"),
                           "--level", "3", "--device", "cpu"], cwd=ROOT, capture_output=True, text=True, timeout=290,
                          env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "rebuild-check.jsonl").read_text().splitlines()]
    assert [r["row"] for r in rows] == ["first", "rebuild", "rebuild-probing"]
    assert all(r["build_s"] > 0 and r["package"] == "compiled" for r in rows), rows  # new weights: compiled
    assert (tmp_path / "out" / "template-diff.txt").is_file()
    assert "the vector-ISA record saved" in done.stdout


def test_rebuild_check_runs_only_the_rows_asked_for(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    script = str(ROOT / "scripts" / "gpu_rebuild_check.py")
    refused = subprocess.run([sys.executable, script, str(tmp_path / "x"), "--rows", "first,second"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2 and "--rows: no row second" in refused.stderr, refused.stderr
    done = subprocess.run([sys.executable, script, str(tmp_path / "out"), "--level", "3", "--device", "cpu",
                           "--rows", "first"], cwd=ROOT, capture_output=True, text=True, timeout=200, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "rebuild-check.jsonl").read_text().splitlines()]
    assert [r["row"] for r in rows] == ["first"] and "the vector-ISA record saved" not in done.stdout


def test_vec_isa_probe_prints_its_seconds_and_the_isas_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "vec_isa_probe.py")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip()
    assert line.startswith("import torch ") and "valid_vec_isa_list" in line and "picked" in line, line
