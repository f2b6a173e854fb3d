"""Argument groups: flags read straight into configs, per-side overrides, config files under flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from streamrt.cli.args import BuildArgs, CacheArgs, PipelineArgs, ServerArgs, plain_text
from streamrt.config import BuildConfig, CalibrationMethod, ImagePreprocess, Precision
from streamrt.errors import ConfigError
from streamrt.pipeline import PipelineConfig, Topology


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    BuildArgs().add_to(parser)
    BuildArgs("a-").add_to(parser)
    BuildArgs("b-").add_to(parser)
    CacheArgs().add_to(parser)
    return parser


def test_no_flags_give_the_default_config() -> None:
    args = _build_parser().parse_args([])
    assert BuildArgs().config(args) == BuildConfig()
    assert CacheArgs.use_cache(args) and CacheArgs.cache_dir(args) is None


def test_every_build_flag_reaches_its_field(tmp_path: Path) -> None:
    args = _build_parser().parse_args([
        "--backend", "torch_inductor", "--precision", "int8", "--opt-level", "1", "--memory-limit", "512",
        "--no-keep-io-types", "--fp32-ops", "Softmax, Exp", "--option", "threads=2", "--option", 'p=["x"]',
        "--min-shapes", "x:1x3", "--max-shapes", "x:8x3", "--calib", str(tmp_path), "--calib-method", "minmax",
        "--calib-samples", "5", "--per-tensor", "--calib-size", "32x48", "--calib-std", "0.5,0.5,0.5",
    ])
    cfg = BuildArgs().config(args)
    assert (cfg.backend, cfg.precision, cfg.optimization_level, cfg.memory_limit_mb) == (
        "torch_inductor", Precision.INT8, 1, 512)
    assert cfg.keep_io_types is False and cfg.fp32_ops == ("Softmax", "Exp")
    assert dict(cfg.backend_options) == {"threads": 2, "p": ["x"]}
    assert cfg.profiles[0].ranges["x"].max == (8, 3)
    c = cfg.calibration
    assert c is not None and (c.data, c.method, c.max_samples, c.per_channel) == (
        tmp_path, CalibrationMethod.MINMAX, 5, False)
    assert c.preprocess == ImagePreprocess(size=(32, 48), std=(0.5, 0.5, 0.5))


def test_flags_override_the_config_file_and_sides_override_shared(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text("precision: fp16\noptimization_level: 1\nbackend_options: {threads: 1, a: 1}\n")
    args = _build_parser().parse_args(["--config", str(path), "--opt-level", "4", "--option", "threads=3",
                                       "--b-precision", "bf16", "--a-backend", "torch_inductor"])
    shared = BuildArgs().config(args)
    assert (shared.precision, shared.optimization_level) == (Precision.FP16, 4)
    assert dict(shared.backend_options) == {"threads": 3, "a": 1}
    a, b = BuildArgs("a-").config(args), BuildArgs("b-").config(args)
    assert (a.backend, a.precision) == ("torch_inductor", Precision.FP16)
    assert (b.backend, b.precision) == ("onnxruntime", Precision.BF16)
    assert b.optimization_level == 4
    assert BuildArgs("b-").build.given(args) == {"precision": "bf16"}


def test_bad_flag_values_are_config_errors() -> None:
    args = _build_parser().parse_args(["--option", "threads"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        BuildArgs().config(args)
    args = _build_parser().parse_args(["--calib", "d", "--calib-size", "32"])
    with pytest.raises(ConfigError, match="--calib-size must be HxW"):
        BuildArgs().config(args)


def test_pipeline_and_server_groups() -> None:
    parser = argparse.ArgumentParser()
    PipelineArgs(defaults={"ring_size": 2}).add_to(parser)
    ServerArgs().add_to(parser)
    args = parser.parse_args(["--topology", "single", "--workers", "3", "--graphs", "--grpc-port", "-1",
                              "--http-port", "0", "--model", "a", "--model", "b", "--no-strict-readiness"])
    pipe = PipelineArgs(defaults={"ring_size": 2}).config(args)
    assert pipe == PipelineConfig(topology=Topology.SINGLE, workers=3, ring_size=2, cuda_graphs=True)
    server = ServerArgs().config(args)
    assert (server.http_port, server.grpc_port, server.metrics_port) == (0, None, 8002)
    assert server.startup_models == ("a", "b") and server.strict_readiness is False and server.model_control


def test_help_texts_are_plain() -> None:
    assert plain_text("run ``--out DIR`` see :class:`~streamrt.Pipeline`") == "run --out DIR see streamrt.Pipeline"
