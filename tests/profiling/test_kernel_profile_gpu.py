"""Kernel profile of a small CUDA plan: a non-empty table whose shares add up, and a sane roofline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import catalogue_file
from streamrt.cli.main import main

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_profile_of_a_small_cuda_plan(tmp_path: Path) -> None:
    import torch

    from streamrt import load
    from streamrt.building.module_builder import build_module
    from streamrt.config import BuildConfig
    from streamrt.profiling.flops import count_flops
    from streamrt.profiling.gpu_report import GpuProfileReport
    from streamrt.profiling.kernel_profile import profile_cuda_kernels
    from streamrt.testing.zoo import MODELS

    net = MODELS["resnet"].make()
    x = torch.randn(8, 3, 64, 64, device="cuda")
    config = BuildConfig(backend="torch_inductor", precision="fp16", backend_options={"device": "cuda"})
    plan = build_module(net, [x], tmp_path / "resnet.plan", config, input_names=["images"], output_names=["out"])
    iterations = 4
    with load(plan.path) as engine:
        profile = profile_cuda_kernels(engine, {"images": x}, iterations, timed_runs=10)
    table = profile.table
    assert table.rows, "no GPU kernels recorded"
    assert sum(r.share for r in table.rows) == pytest.approx(100.0, abs=1e-6)
    assert sum(r.calls for r in table.rows) % iterations == 0  # every query launches the same kernels
    assert "matmul/conv" in {r.kind for r in table.rows}
    assert profile.graphs and profile.wall_ms > 0 and table.per_iteration_ms > 0

    flops = count_flops(net.cuda(), [x])
    report = GpuProfileReport.build(profile, flops, "fp16", torch.cuda.get_device_name())
    assert report.roofline.achieved_tflops is not None and report.roofline.achieved_tflops > 0
    if report.roofline.peaks is not None:
        assert 0 < (report.roofline.fraction_of_peak or 0) < 1
    rates = {r.kind: r for r in report.rates}
    assert rates["matmul/conv"].flops_per_iteration == flops.total
    print(report.format(top=10))


def test_profile_cli_on_an_onnx_model_on_the_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = catalogue_file("small_cnn", tmp_path)
    argv = ["profile", str(model), "--backend", "torch_inductor", "--option", "device=cuda",
            "--min-shapes", "x:1x3x32x32", "--opt-shapes", "x:4x3x32x32", "--max-shapes", "x:8x3x32x32",
            "--batch", "4", "--iterations", "3", "--timed-runs", "5", "--json",
            "--trace", str(tmp_path / "trace.json"), "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kernels"] and data["layers"]
    assert sum(k["share_percent"] for k in data["kernel_kinds"]) == pytest.approx(100.0)
    assert data["roofline"]["flops"]["total"] > 0 and data["roofline"]["wall_ms"] > 0
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert main([*argv[:-5], "--json", "--per-node", "--cache-dir", str(tmp_path / "cache")]) == 0
    per_node = json.loads(capsys.readouterr().out)
    assert per_node["layers"] and "kernels" not in per_node
