"""The cattrs converter behind every config: strict scalars, unknown keys, one-line located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrt import _configio
from streamrt.config import BuildConfig, Precision
from streamrt.errors import ConfigError
from streamrt.pipeline import PipelineConfig, Topology
from streamrt.serve.configs.config_message import from_mapping


def test_enums_case_insensitive_and_paths() -> None:
    cfg = BuildConfig.from_dict({"precision": "FP16", "calibration": {"data": "d", "cache": "c.json"},
                                 "optimization_level": "2"})
    assert cfg.precision is Precision.FP16 and cfg.optimization_level == 2
    assert cfg.calibration is not None and cfg.calibration.data == Path("d")
    assert cfg.to_dict()["calibration"]["cache"] == "c.json"
    assert PipelineConfig.from_dict({"topology": "Sync"}).topology is Topology.SYNC


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"optimization_level": True}, "optimization_level must be an integer, got True"),
        ({"optimization_level": 1.5}, "optimization_level must be an integer, got 1.5"),
        ({"keep_io_types": "yes"}, "keep_io_types must be true or false, got 'yes'"),
        ({"calibration": {"data": "d", "methd": "minmax"}},
         "calibration: unknown keys ['methd']; known: ['cache', 'data', 'max_samples', 'method', 'per_channel', "
         "'percentile', 'preprocess']"),
        ({"calibration": {"data": "d", "max_samples": 0}}, "calibration: max_samples must be an integer >= 1, got 0"),
        ({"calibration": {"method": "minmax"}}, "calibration: missing required key 'data'"),
        ({"calibration": {"data": "d", "preprocess": {"layout": "CHW"}}},
         "calibration.preprocess: preprocess layout must be NCHW or NHWC, got 'CHW'"),
        ({"precision": "fp8"}, "precision must be one of fp32, tf32, fp16, bf16, int8, got 'fp8'"),
        ({"calibration": [1]}, "calibration must be a mapping, got list"),
        ({"fp32_ops": "Softmax"}, "fp32_ops must be a list, got 'Softmax'"),  # not ('S', 'o', 'f', ...)
        ({"calibration": {"data": "d", "preprocess": {"size": [1, 2, 3]}}},
         "calibration.preprocess: size must be a list of 2 values, got [1, 2, 3]"),
    ],
)
def test_build_config_errors_are_one_located_line(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        BuildConfig.from_dict(data)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_pipeline_unknown_key_names_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown PipelineConfig keys \['rings'\]; known: \['close_timeout_s'"):
        PipelineConfig.from_dict({"rings": 2})
    with pytest.raises(ConfigError, match="workers must be an integer, got '2x'"):
        PipelineConfig.from_dict({"workers": "2x"})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"instance_group": [{"count": 1}, {"count": -2}]},
         "model 'm' instance_group[1]: count must be an integer >= 1, got -2"),
        ({"model_warmup": [{"batchsize": 1}]},
         "model 'm': Failed to parse model_warmup field: Message type \"inference.ModelWarmup\" has no field named"),
        ({"build": {"precison": "fp16"}}, "model 'm' build: unknown build config keys ['precison']"),
        ({"dynamic_batching": {"preferred_batch_size": [4, 0]}},
         "model 'm' dynamic_batching: preferred_batch_size must be an integer >= 1, got 0"),
        ({"version_policy": {"latest": {"num_versions": 0}}},
         "model 'm' version_policy: num_versions must be an integer >= 1, got 0"),
        ({"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [0]}]},
         "model 'm' input[0]: dims of 'x' must be >= 1 or -1, got (0,)"),
    ],
)
def test_model_config_errors_are_located(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping(data, "m")
    assert str(err.value).startswith(message)


def test_protobuf_json_integers_and_triton_round_trip() -> None:
    # json_format writes 64-bit integers as strings; the short instance kind is accepted.
    cfg = from_mapping({"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": "100"},
                        "instance_group": [{"count": "2", "kind": "cpu"}],
                        "parameters": {"a": {"string_value": "b"}}}, "m")
    assert cfg.dynamic_batching is not None and cfg.dynamic_batching.max_queue_delay_microseconds == 100
    assert cfg.instance_group[0].kind == "KIND_CPU" and cfg.parameters == {"a": "b"}
    from streamrt.serve.configs.config_message import to_message
    from streamrt.serve.configs.triton_config import message_json

    triton = message_json(to_message(cfg, "onnxruntime_onnx"))
    assert triton["instance_group"][0]["name"] == "m_0"
    assert triton["dynamic_batching"]["default_queue_policy"]["timeout_action"] == "REJECT"
    # Triton prints no warm-up as an empty list, which reads back as "none" rather than "the default".
    assert from_mapping(triton, "m") == cfg.replace(model_warmup=(), platform="onnxruntime_onnx")


def test_structure_refuses_a_non_mapping() -> None:
    with pytest.raises(ConfigError, match="where: expected a mapping, got list"):
        _configio.structure([1], BuildConfig, "where")
