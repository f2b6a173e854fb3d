"""Optimization levels and the timing cache in real CPU builds (AOTInductor's C++ path).

Level 0 of a convolution model; the same level-4 matmul model three times with one
``--timing-cache`` directory: the first times the GEMM candidates (a miss), the second (its
packages removed) reuses the timing (a hit), the third copies the autotuned package; and level-3
module builds into one timing cache: the same program reuses its package, changed weights, a
changed shape or a directory from another device do not (a few minutes on 2 busy cores).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streamrt
from helpers import catalogue_file
from streamrt.backends.torch_inductor.package_cache import PACKAGES_DIR
from streamrt.cli.inspect import _text, describe
from streamrt.cli.main import main
from streamrt.config import BuildConfig
from streamrt.plan import read_plan
from streamrt.testing.models import CATALOGUE

pytestmark = [pytest.mark.torch, pytest.mark.slow]

CPU = {"device": "cpu"}


def test_level_0_plan_records_its_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "m.plan"
    args = ["build", str(catalogue_file("conv_bn_relu", tmp_path)), "-o", str(plan), "--backend", "torch_inductor",
            "--optimization-level", "0", "--option", "device=cpu", "--no-verify-shapes", "--no-cache",
            "--cache-dir", str(tmp_path / "c")]
    assert main(args) == 0
    summary = capsys.readouterr().out
    assert "optimization level 0: max_autotune off, coordinate descent off, freezing off, memory format inductor" \
        in summary and "timing cache" in summary
    manifest = read_plan(plan).manifest
    backend = manifest.build_settings["backend"]
    recipe = backend["optimization"]
    assert recipe["level"] == 0 and recipe["memory_format"] == "inductor" and not recipe["cudnn_benchmark"]
    assert recipe["inductor"]["aot_inductor.compile_wrapper_opt_level"] == "O0"
    assert recipe["inductor"]["pattern_matcher"] is False and recipe["inductor"]["max_autotune"] is False
    assert backend["inductor"] == recipe["inductor"] and backend["fp32_precision"] == "ieee"
    assert manifest.build_settings["config"]["optimization_level"] == 0
    assert "--optimization-level 0" in manifest.build_command
    assert "level 0: max_autotune off" in _text(describe(plan))  # streamrt inspect
    # The level-0 plan still computes the model (fresh random data vs the NumPy reference).
    model = CATALOGUE["conv_bn_relu"]
    inputs = model.inputs(np.random.default_rng(), 1)
    with streamrt.load(plan) as engine, engine.create_context() as ctx:
        got = ctx.infer(inputs)
    np.testing.assert_allclose(got["y"], model.reference(model.make(), inputs)["y"], rtol=1e-4, atol=1e-4)


def test_timing_cache_is_reused_by_a_rebuild(tmp_path: Path) -> None:
    model = catalogue_file("matmul", tmp_path)
    cache = tmp_path / "timings"
    config = BuildConfig(backend="torch_inductor", optimization_level=4, timing_cache=cache, backend_options=CPU,
                         verify_shapes=False)
    lines: list[str] = []
    first_lines: list[str] = []
    first = streamrt.build(model, config, tmp_path / "a.plan", cache=False, cache_dir=tmp_path / "c",
                           progress=first_lines.append)
    # each miss says what the cache lacked (a first build: inputs never timed)
    assert any("timing cache miss: addmm: these inputs never timed" in line for line in first_lines), first_lines
    shutil.rmtree(cache / PACKAGES_DIR)  # the timings alone: the package cache would skip the compile
    second = streamrt.build(model, config, tmp_path / "b.plan", cache=False, cache_dir=tmp_path / "c",
                            progress=lines.append)
    one, two = (r.manifest.build_settings["backend"]["timing_cache"] for r in (first, second))
    assert one["path"] == str(cache) and one["misses"] >= 1 and one["hits"] == 0
    assert two["hits"] == one["misses"] and two["misses"] == 0
    assert not any("timing cache miss" in line for line in lines), lines
    assert one["package"] == two["package"] == "compiled"
    assert f"timing cache {cache}: {two['hits']} hits, 0 misses (GEMM/convolution autotuning); package compiled" \
        in lines
    assert (cache / "streamrt-timing-cache.json").is_file()
    # The autotuned package the second build kept: a third build copies it (no lookups, nothing compiled).
    third = streamrt.build(model, config, tmp_path / "t.plan", cache=False, cache_dir=tmp_path / "c")
    three = third.manifest.build_settings["backend"]["timing_cache"]
    assert three["package"] == "reused" and three["hits"] == three["misses"] == 0
    inputs = CATALOGUE["matmul"].inputs(np.random.default_rng(), 1)
    with streamrt.load(second.path) as engine, engine.create_context() as ctx:
        expected = {k: np.array(v, copy=True) for k, v in ctx.infer(inputs).items()}
    with streamrt.load(third.path) as engine, engine.create_context() as ctx:
        got = ctx.infer(inputs)
    for name, value in expected.items():
        np.testing.assert_array_equal(np.asarray(got[name]), value)


def test_memory_format_is_chosen_by_timing_both_layouts() -> None:
    import torch

    from streamrt.backends.torch_inductor.builder import compile_package
    from streamrt.backends.torch_inductor.levels import layout_knobs
    from streamrt.backends.torch_inductor.memory_format import choose_memory_format

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU()).eval()
    with torch.no_grad():
        ep = torch.export.export(net, (torch.randn(2, 3, 16, 16),))
        lines: list[str] = []
        choice = choose_memory_format(
            ep, lambda fmt, _optional: compile_package(ep, {"cpp.dynamic_threads": True, **layout_knobs(fmt)}), "cpu",
            lines.append,
        )
    assert set(choice.timings_ms) == {"channels_last", "contiguous"} and all(t > 0 for t in choice.timings_ms.values())
    assert choice.timings_ms[choice.memory_format] == min(choice.timings_ms.values())
    assert choice.package[:2] == b"PK" and lines[-1].startswith(f"memory format: {choice.memory_format} (")


def _mlp(seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()


def _infer(path: Path, x: Any) -> Any:
    import torch

    with streamrt.load(path) as engine, engine.create_context() as ctx:
        return torch.as_tensor(ctx.infer({"input_0": x})["output_0"]).clone()


def test_a_rebuild_into_the_same_timing_cache_reuses_the_package_and_a_changed_model_or_device_does_not(
        tmp_path: Path) -> None:
    import json

    import torch

    from streamrt.backends.torch_inductor.cache import IDENTITY_FILE
    from streamrt.building.module_builder import build_module

    cache = tmp_path / "timings"
    config = BuildConfig(backend="torch_inductor", timing_cache=cache, backend_options=CPU, verify_shapes=False)

    def build(net: Any, batch: int, name: str, timings: Path = cache) -> tuple[Any, list[str]]:
        lines: list[str] = []
        built = build_module(net, [torch.randn(batch, 16)], tmp_path / name, config.replace(timing_cache=timings),
                             progress=lines.append, cache_dir=tmp_path / "c")
        return built, lines

    net = _mlp(0)
    first, _ = build(net, 4, "a.plan")
    second, lines = build(net, 4, "b.plan")
    one, two = (r.manifest.build_settings["backend"]["timing_cache"] for r in (first, second))
    assert one["package"] == "compiled" and two["package"] == "reused" and two["packages"] == ["reused"]
    assert any(line.endswith("; package reused") and line.startswith(f"timing cache {cache}") for line in lines)
    assert any("package reused from the package cache" in line for line in lines), lines
    x = torch.randn(4, 16)
    torch.testing.assert_close(_infer(second.path, x), _infer(first.path, x), rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(_infer(second.path, x), net(x), rtol=1e-4, atol=1e-4)

    other_weights, _ = build(_mlp(1), 4, "w.plan")
    other_shape, _ = build(net, 6, "s.plan")
    for built in (other_weights, other_shape):
        assert built.manifest.build_settings["backend"]["timing_cache"]["package"] == "compiled"

    foreign = tmp_path / "foreign"
    shutil.copytree(cache, foreign)
    record = json.loads((foreign / IDENTITY_FILE).read_text())
    (foreign / IDENTITY_FILE).write_text(json.dumps({**record, "device": "NVIDIA A100"}))
    elsewhere, _ = build(net, 4, "f.plan", foreign)
    stats = elsewhere.manifest.build_settings["backend"]["timing_cache"]
    assert "NVIDIA A100" in stats["ignored"] and "package" not in stats  # ignored: compiled, nothing reused


def test_a_retrained_models_level_4_rebuild_autotunes_first_from_the_timing_cache(tmp_path: Path) -> None:
    """New weights, same structure: the package misses and the timing cache answers every autotuning lookup, so the
    build skips the level-3 compile it used to make first (38 of ResNet-50's 96 s on an H100 on 2026-12-05) and
    the plan still computes the retrained module."""
    import torch

    from streamrt.building.module_builder import build_module

    cache = tmp_path / "timings"
    config = BuildConfig(backend="torch_inductor", optimization_level=4, timing_cache=cache, backend_options=CPU,
                         verify_shapes=False)

    def build(net: Any, name: str) -> tuple[Any, list[str]]:
        lines: list[str] = []
        return build_module(net, [torch.randn(4, 16)], tmp_path / name, config, progress=lines.append,
                            cache_dir=tmp_path / "c"), lines

    _, first_lines = build(_mlp(0), "a.plan")
    assert any("compiling the level-3 recipe first" in line for line in first_lines), first_lines
    retrained = _mlp(7)
    second, lines = build(retrained, "b.plan")
    assert any("autotuning first from the timing cache" in line for line in lines), lines
    assert not any("level-3 recipe" in line and "compil" in line and "kept for" not in line for line in lines), lines
    stats = second.manifest.build_settings["backend"]["timing_cache"]
    assert stats["package"] == "compiled" and stats["misses"] == 0, stats
    assert second.manifest.build_settings["backend"]["build_budget"]["fallback_s"] == 0.0
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(_infer(second.path, x), retrained(x), rtol=1e-4, atol=1e-4)
