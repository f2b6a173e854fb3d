"""Optimization levels, --tf32 and --timing-cache without compiling: recipes, cache keys, flags, CLI.

The builds themselves are in test_optimization_builds.py (CPU, slow) and
test_optimization_levels_gpu.py (H200).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import pytest

from helpers import catalogue_file
from streamrt.building.accuracy_gate import PrecisionStep
from streamrt.building.builder import build_command, cache_key
from streamrt.cli._optimization import optimization_lines
from streamrt.cli.args import BuildArgs
from streamrt.config import BuildConfig, Precision
from streamrt.errors import AccuracyError, ConfigError
from streamrt.measure.accuracy import accuracy_of
from streamrt.onnx.model import load_model

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")

from streamrt.backends.torch_inductor.backend import TorchInductorBackend  # noqa: E402
from streamrt.backends.torch_inductor.cache import IDENTITY_FILE, timing_cache  # noqa: E402
from streamrt.backends.torch_inductor.levels import resolve_recipe  # noqa: E402
from streamrt.backends.torch_inductor.tf32 import backend_flags  # noqa: E402


def _config(level: int, **kwargs: object) -> BuildConfig:
    return BuildConfig(backend="torch_inductor", optimization_level=level, **kwargs)  # type: ignore[arg-type]


def test_level_0_cuts_compile_work_and_level_3_is_inductors_defaults() -> None:
    fast, default = resolve_recipe(_config(0), "cuda"), resolve_recipe(_config(3), "cuda")
    assert fast.inductor["aot_inductor.compile_wrapper_opt_level"] == "O0"
    assert fast.inductor["pattern_matcher"] is False and fast.inductor["triton.autotune_pointwise"] is False
    # Level 3 is today's recipe: nothing but the three switches, all off, and Inductor's layout heuristic.
    assert default.inductor == {"max_autotune": False, "coordinate_descent_tuning": False, "freezing": False}
    assert default.memory_format == "inductor" and not default.cudnn_benchmark
    cpu = resolve_recipe(_config(3), "cpu").inductor
    assert cpu["cpp.dynamic_threads"] is True
    assert "triton.autotune_pointwise" not in resolve_recipe(_config(0), "cpu").inductor


def test_levels_4_and_5_add_autotuning_freezing_layout_and_cudnn_benchmark() -> None:
    four, five = resolve_recipe(_config(4), "cuda"), resolve_recipe(_config(5), "cuda")
    assert four.inductor["max_autotune"] and not four.inductor["coordinate_descent_tuning"]
    assert four.inductor["max_autotune_gemm_backends"].startswith("ATEN,TRITON")
    assert not four.inductor["freezing"] and four.memory_format == "inductor" and not four.cudnn_benchmark
    assert five.inductor["coordinate_descent_tuning"] and five.inductor["freezing"]
    assert five.cudnn_benchmark and four.inductor["max_autotune_conv_backends"] == "ATEN,TRITON"
    # Level 5 on CUDA is bounded: convolutions from cuDNN (benchmark mode), GEMMs autotuned, one layout.
    assert five.inductor["max_autotune_conv_backends"] == "ATEN" and five.memory_format == "inductor"
    # and its convolution + (add +) ReLU run as cuDNN's fused kernels; elsewhere Inductor's epilogues stay
    assert five.conv_epilogues == "cudnn" and four.conv_epilogues == "inductor"
    assert resolve_recipe(_config(3), "cuda").conv_epilogues == "inductor"
    assert resolve_recipe(_config(5), "cpu").conv_epilogues == "inductor"  # cuDNN's ops need CUDA
    assert resolve_recipe(_config(5), "cpu").memory_format == "measure"
    assert not resolve_recipe(_config(5), "cpu").cudnn_benchmark  # no cuDNN on the CPU
    assert resolve_recipe(_config(4), "cpu").inductor["max_autotune_gemm_backends"] == "ATEN,CPP"


def test_backend_options_override_the_level() -> None:
    recipe = resolve_recipe(_config(5, backend_options={"freezing": False, "memory_format": "channels_last"}), "cuda")
    assert recipe.inductor["freezing"] is False and recipe.memory_format == "channels_last"
    assert recipe.inductor["force_layout_optimization"] is True
    assert resolve_recipe(_config(5, backend_options={"conv_epilogues": "inductor"}), "cuda").conv_epilogues == \
        "inductor"
    assert resolve_recipe(_config(3, backend_options={"memory_format": "contiguous"}), "cpu").inductor[
        "layout_optimization"] is False
    unbounded = resolve_recipe(_config(5, backend_options={"conv_backends": "aten,triton",
                                                            "memory_format": "measure"}), "cuda")
    assert unbounded.inductor["max_autotune_conv_backends"] == "ATEN,TRITON" and unbounded.memory_format == "measure"
    with pytest.raises(ConfigError, match="conv_backends must be one of ATEN, ATEN,TRITON"):
        resolve_recipe(_config(5, backend_options={"conv_backends": "CUDNN"}), "cuda")
    with pytest.raises(ConfigError, match="memory_format must be one of"):
        resolve_recipe(_config(5, backend_options={"memory_format": "nhwc"}), "cuda")


def test_cudnn_benchmark_option_overrides_the_level_on_cuda_only() -> None:
    assert not resolve_recipe(_config(5, backend_options={"cudnn_benchmark": False}), "cuda").cudnn_benchmark
    assert not resolve_recipe(_config(5, backend_options={"cudnn_benchmark": "off"}), "cuda").cudnn_benchmark
    assert resolve_recipe(_config(3, backend_options={"cudnn_benchmark": "true"}), "cuda").cudnn_benchmark
    inductor_epilogues = resolve_recipe(_config(5, backend_options={"conv_epilogues": "inductor"}), "cuda")
    assert inductor_epilogues.cudnn_benchmark  # level 5's default with Inductor's epilogues
    assert not resolve_recipe(_config(5, backend_options={"cudnn_benchmark": False}), "cpu").cudnn_benchmark
    with pytest.raises(ConfigError, match="cudnn_benchmark=true needs a CUDA build"):
        resolve_recipe(_config(5, backend_options={"cudnn_benchmark": True}), "cpu")
    with pytest.raises(ConfigError, match="cudnn_benchmark must be true or false"):
        resolve_recipe(_config(5, backend_options={"cudnn_benchmark": "sometimes"}), "cuda")


def test_cache_key_changes_with_the_level_and_the_resolved_recipe(tmp_path: Path) -> None:
    model = load_model(catalogue_file("conv_bn_relu", tmp_path))
    backend = TorchInductorBackend()
    target = {"kind": "cpu"}
    keys = set()
    for level in range(6):
        config = _config(level, backend_options={"device": "cpu"})
        keys.add(cache_key(model, config, target, "v", backend.build_recipe(config)))
    assert len(keys) == 6
    config = _config(3, backend_options={"device": "cpu"})
    same = cache_key(model, config, target, "v", backend.build_recipe(config))
    assert same != cache_key(model, config, target, "v", {**backend.build_recipe(config), "memory_format": "x"})
    # Where timings are kept does not change what is built.
    assert same == cache_key(model, config.replace(timing_cache=tmp_path / "tc"), target, "v",
                             backend.build_recipe(config))


def test_tf32_is_an_fp32_choice() -> None:
    with pytest.raises(ConfigError, match="tf32 applies to fp32 plans only, not precision fp16"):
        BuildConfig(precision="fp16", tf32=True)
    older = BuildConfig(precision="tf32")  # the older spelling is the same build
    assert older == BuildConfig(tf32=True) and older.precision is Precision.FP32 and older.numeric_precision == "tf32"
    assert BuildConfig.from_dict(older.to_dict()) == older and not BuildConfig().tf32
    assert "--tf32" in build_command("m.onnx", "m.plan", older)


def test_cli_flags_reach_build_config(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    BuildArgs().add_to(parser)
    args = parser.parse_args(["--optimization-level", "5", "--tf32", "--timing-cache", str(tmp_path / "tc")])
    config = BuildArgs().config(args)
    assert (config.optimization_level, config.tf32, config.timing_cache) == (5, True, tmp_path / "tc")
    assert BuildArgs().config(parser.parse_args(["--opt-level", "0"])).optimization_level == 0
    plain = BuildArgs().config(parser.parse_args([]))
    assert (plain.optimization_level, plain.tf32, plain.timing_cache) == (3, False, None)
    with pytest.raises(SystemExit):
        parser.parse_args(["--optimization-level", "6"])
    with pytest.raises(ConfigError, match="fp32 plans only"):
        BuildArgs().config(parser.parse_args(["--precision", "fp16", "--tf32"]))
    command = build_command("m.onnx", "m.plan", config)
    assert "--optimization-level 5" in command and f"--timing-cache {tmp_path / 'tc'}" in command


def test_backend_flags_are_restored() -> None:
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark)
    with backend_flags(tf32=not before[0], cudnn_benchmark=not before[2]):
        assert (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark) == (not before[0], not before[0], not before[2])
    assert (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark) == before


def test_timing_cache_from_another_gpu_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "tc"
    identity = {"device": "NVIDIA H200", "torch": "2.13.0", "cuda": "13.0"}
    with timing_cache(folder, identity) as stats:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder)
    assert json.loads((folder / IDENTITY_FILE).read_text()) == identity and not stats.ignored
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with timing_cache(folder, {**identity, "device": "NVIDIA A100"}) as stats:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] != str(folder)
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before
    assert "device 'NVIDIA H200' here 'NVIDIA A100'" in stats.ignored
    assert [r.message for r in caplog.records if "ignoring timing cache" in r.getMessage()]
    assert json.loads((folder / IDENTITY_FILE).read_text()) == identity  # left as it was
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="directory"), timing_cache(tmp_path / "file", identity):
        pass


def _report(rel_error: float) -> object:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(1000).astype(np.float32)
    noise = rng.standard_normal(1000).astype(np.float32)
    test = ref + noise * rel_error * np.linalg.norm(ref) / np.linalg.norm(noise)
    return accuracy_of([({"y": ref}, {"y": test})])


@pytest.mark.parametrize("rel_error, passes", [(3e-3, True), (3e-2, False)])
def test_tf32_gate_accepts_tf32_level_error_only(tmp_path: Path, rel_error: float, passes: bool) -> None:
    model = load_model(catalogue_file("matmul", tmp_path))
    step = PrecisionStep(model, BuildConfig(tf32=True), (), TorchInductorBackend(), tmp_path, lambda line: None)
    report = _report(rel_error)
    step.record["accuracy"] = {}
    if passes:
        step._judge(report)  # type: ignore[arg-type]
        assert step.record["accuracy"]["passed"] and step.record["accuracy"]["threshold"] == "rel_l2=0.01"
    else:
        with pytest.raises(AccuracyError, match=r"tf32 plan misses the TF32 bounds rel_l2=0\.01"):
            step._judge(report)  # type: ignore[arg-type]


def test_optimization_lines_show_the_recipe_and_the_cache() -> None:
    settings = {
        "config": {"tf32": True},
        "backend": {
            "optimization": {
                "level": 5, "inductor": {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON",
                                         "coordinate_descent_tuning": True, "freezing": True},
                "memory_format": "measure", "cudnn_benchmark": True,
                "memory_format_decision": {"memory_format": "channels_last",
                                           "timings_ms": {"channels_last": 1.0, "contiguous": 1.5}},
            },
            "timing_cache": {"path": "tc", "hits": 4, "misses": 1, "ignored": ""},
        },
    }
    first, second = optimization_lines(settings)
    assert "level 5: max_autotune on (ATEN,TRITON), coordinate descent on, freezing on" in first
    assert "memory format channels_last (measured: channels_last 1.000 ms, contiguous 1.500 ms)" in first
    assert first.endswith("cudnn benchmark on, tf32 on") and second == "  timing cache tc: 4 hits, 1 misses"
    settings["backend"]["timing_cache"] = {"path": "tc", "hits": 0, "misses": 0, "ignored": "", "package": "reused"}
    assert optimization_lines(settings)[1] == "  timing cache tc: 0 hits, 0 misses; package reused"


def test_convolution_graphs_are_recognised() -> None:
    from streamrt.backends.torch_inductor.memory_format import has_convolutions

    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)).eval()
    assert has_convolutions(torch.export.export(conv, (torch.randn(1, 3, 8, 8),)))
    assert not has_convolutions(torch.export.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),)))


def test_a_plan_built_by_the_budget_fallback_says_so() -> None:
    fell = {"seconds": 300.0, "spent_s": 286.1, "reserve_s": 90.0, "child_compiles": 1, "fell_back": [
        {"what": "profile 1/1", "to": "level-3 recipe (max_autotune and coordinate_descent_tuning off)",
         "after_s": 211.5, "why": "autotuning passed its 205 s deadline"}]}
    settings = {"config": {}, "backend": {
        "optimization": {"level": 5, "inductor": {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON",
                                                  "max_autotune_conv_backends": "ATEN"}},
        "build_budget": fell}}
    first, budget = optimization_lines(settings, timing_cache=False)
    assert "max_autotune on (ATEN,TRITON; convolutions ATEN)" in first
    assert budget == ("  build budget 300 s: FELL BACK, profile 1/1 -> level-3 recipe (max_autotune and "
                      "coordinate_descent_tuning off) after 211.5 s (autotuning passed its 205 s deadline)")
    kept = {**fell, "spent_s": 120.0, "fell_back": []}
    settings["backend"]["build_budget"] = kept
    assert optimization_lines(settings)[1] == ("  build budget 300 s: kept (autotuned in 1 compile process(es), "
                                              "120.0 s spent)")
    settings["backend"]["build_budget"] = {**kept, "child_compiles": 0}  # nothing autotuned: nothing to say
    assert len(optimization_lines(settings)) == 1
