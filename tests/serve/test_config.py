"""Model and server config loading and validation; protocol codec edge cases; the status table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from streamrt.errors import ConfigError, QueueFullError, RequestError, ShapeError, UnknownModelError
from streamrt.serve import BatchingConfig, ServerConfig
from streamrt.serve.configs.config_message import from_mapping, read_config_file, to_message
from streamrt.serve.configs.triton_config import message_json
from streamrt.serve.wire.protocol import InferRequest, InferResponse, decode_http_request, encode_http_response
from streamrt.serve.wire.status import status_for


def test_yaml_json_and_pbtxt_configs_agree(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "max_batch_size: 8\ninput: [{name: x, data_type: TYPE_FP32, dims: [3, 32, 32]}]\n"
        "dynamic_batching: {max_queue_delay_microseconds: 100, preferred_batch_size: [4, 8]}\n"
        "instance_group: [{count: 2, kind: KIND_CPU}]\nversion_policy: {specific: {versions: [1, 3]}}\n"
    )
    (tmp_path / "config.pbtxt").write_text(
        'name: "m"\nmax_batch_size: 8\ninput [{ name: "x" data_type: TYPE_FP32 dims: [3, 32, 32] }]\n'
        "dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [4, 8] }\n"
        "instance_group [{ count: 2 kind: KIND_CPU }]\nversion_policy { specific { versions: [1, 3] } }\n"
        "optimization { input_pinned_memory { enable: true } }\n"
    )
    a = read_config_file(tmp_path / "config.yaml", "m")
    b = read_config_file(tmp_path / "config.pbtxt", "m")
    assert a == b
    assert a.dynamic_batching == BatchingConfig(100, (4, 8))
    assert a.instance_count == 2 and a.version_policy.select([1, 2, 3, 4]) == [1, 3]
    # The reply is the message itself; Triton's JSON of it reads back to the same config.
    reply = message_json(to_message(a, "onnxruntime_onnx"))
    assert reply["input"][0]["dims"] == [3, 32, 32] and reply["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    c = from_mapping(json.loads(json.dumps(reply)), "m")
    assert c.input == a.input and c.dynamic_batching == a.dynamic_batching


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"max_batch_size": -1}, "max_batch_size must be an integer >= 0, got -1"),
        ({"max_batch_size": "many"}, "max_batch_size"),
        ({"max_batch_sise": 4}, 'no field named "max_batch_sise"'),
        ({"instance_group": [{"count": -1}]}, "count must be an integer >= 1, got -1"),
        ({"instance_group": [{"kind": "KIND_TPU"}]}, "KIND_TPU"),
        ({"input": [{"name": "x", "data_type": "TYPE_QUUX"}]}, "TYPE_QUUX"),
        ({"dynamic_batching": {"priority_levels": 2, "default_priority_level": 3}}, "default_priority_level"),
        ({"dynamic_batching": {"default_queue_policy": {"timeout_action": "DELAY"}}}, "DELAY is not supported"),
        ({"version_policy": {"newest": {}}}, "newest"),
        ({"sequence_batching": {"iterative_sequence": True}},
         "config field 'sequence_batching.iterative_sequence' is not supported"),
        ({"input": [{"name": "x", "data_type": "FP32", "dims": [1], "optional": True}]},
         "config field 'input[0].optional' is not supported: optional inputs"),
        ({"platform": "tensorflow_graphdef"}, "platform/backend 'tensorflow_graphdef' is not supported"),
        ({"name": "other"}, "differs from its directory"),
    ],
)
def test_model_config_errors_name_the_field(data: dict, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping(data, "m")
    assert words in str(err.value) and "model 'm'" in str(err.value)


def test_server_config_validation() -> None:
    assert ServerConfig().host == "127.0.0.1"
    with pytest.raises(ConfigError, match="http_port"):
        ServerConfig(http_port=70000)
    with pytest.raises(ConfigError, match="auth_token"):
        ServerConfig(auth_token=" ")


def test_http_codec_round_trip_binary_and_json() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    header = json.dumps({"id": "7", "inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                                "parameters": {"binary_data_size": 24}}],
                         "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}]}).encode()
    req = decode_http_request(header + x.tobytes(), len(header), model="m", version="", max_elements=100)
    np.testing.assert_array_equal(req.inputs["x"], x)
    resp = InferResponse("m", "1", req.id, {"y": x * 2, "z": np.array([True, False])})
    body, length = encode_http_response(resp, req)
    assert length is not None
    head = json.loads(body[:length])
    assert head["id"] == "7" and head["outputs"][0]["parameters"]["binary_data_size"] == 24
    assert head["outputs"][1]["data"] == [True, False]
    np.testing.assert_array_equal(np.frombuffer(body[length:], np.float32).reshape(2, 3), x * 2)
    plain, none = encode_http_response(resp, InferRequest("m"))
    assert none is None and json.loads(plain)["outputs"][0]["data"] == (x * 2).ravel().tolist()


def test_status_table() -> None:
    assert status_for(RequestError("x")).http == 400
    assert status_for(ShapeError("x")).grpc == "INVALID_ARGUMENT"
    assert status_for(UnknownModelError("x")).http == 404
    assert status_for(QueueFullError("x")).reason == "REJECTED"
    assert status_for(RuntimeError("x")).http == 500


def test_public_surface() -> None:
    import streamrt.serve as serve

    for name in serve.__all__:
        assert getattr(serve, name) is not None


def test_pbtxt_list_syntax_hints_and_refusals() -> None:
    from streamrt.serve.configs.config_message import from_message
    from streamrt.serve.configs.triton_config import parse_text, unsupported_fields

    text = ('name: "m" max_batch_size: 4 input [ { name: "x" data_type: TYPE_UINT32 dims: [ -1 ] } ]\n'
            "optimization { input_pinned_memory { enable: true } cuda { busy_wait_events: true } }\n"
            "response_cache { enable: false }\n")
    cfg = from_message(parse_text(text, "m"), "m")
    assert cfg.input[0].data_type.kserve == "UINT32" and cfg.input[0].dims == (-1,) and cfg.max_batch_size == 4
    refused = parse_text('name: "m" sequence_batching { control_input [ { name: "S" control [ { kind: '
                         "CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] iterative_sequence: true }\n"
                         'instance_group [ { count: 1 host_policy: "numa0" } ]\n'
                         "optimization { cuda { graphs: true } }\nresponse_cache { enable: true }", "m")
    paths = [p for p, _ in unsupported_fields(refused)]
    assert paths == ["instance_group[0].host_policy", "optimization.cuda.graphs",
                     "sequence_batching.iterative_sequence", "response_cache.enable"]
    with pytest.raises(ConfigError, match=r"config field 'instance_group\[0\]\.host_policy' is not supported"):
        from_message(refused, "m")
    with pytest.raises(ConfigError, match="does not follow Triton's schema"):
        parse_text('name: "m" max_batch_size: 4 colour: "red"', "m")


def test_profile_parameters_and_derived_profile() -> None:
    from streamrt.serve.configs.derived_profiles import DYNAMIC_DIM_MAX, derive_profile
    from streamrt.types import DType, TensorSpec

    cfg = from_mapping({"max_batch_size": 4, "parameters": {"min_shapes": "x:1x2", "opt_shapes": "x:2x8",
                                                            "max_shapes": "x:4x64"}}, "m")
    assert cfg.build.profiles[0].ranges["x"].max == (4, 64) and cfg.parameters["max_shapes"] == "x:4x64"
    spec = TensorSpec("x", DType.BYTES, (-1, -1, 3))
    derived = derive_profile(from_mapping({"max_batch_size": 8}, "m"), [spec])
    assert derived is not None and derived.ranges["x"].min == (1, 1, 3)
    assert derived.ranges["x"].max == (8, DYNAMIC_DIM_MAX, 3)
    fixed = from_mapping({"max_batch_size": 8, "input": [{"name": "x", "data_type": "BYTES", "dims": [5, 3]}]}, "m")
    assert derive_profile(fixed, [spec]).ranges["x"].max == (8, 5, 3)  # type: ignore[union-attr]


def test_classification_strings_match_triton_format() -> None:
    from streamrt.serve.models.classification import top_k_classes

    rng = np.random.default_rng()
    scores = rng.standard_normal((2, 5)).astype(np.float32)
    out = top_k_classes(scores, 3, ["a", "b"], batched=True)
    assert out.shape == (2, 3) and out.dtype == object
    for row, strings in zip(scores, out, strict=True):
        order = np.argsort(-row, kind="stable")[:3]
        assert list(strings) == [f"{row[i]:f}:{i}".encode() + (b":" + b"ab"[i:i + 1] if i < 2 else b"")
                                 for i in order]
    with pytest.raises(RequestError, match="numeric"):
        top_k_classes(np.array([b"x"], dtype=object), 1, [], batched=False)
