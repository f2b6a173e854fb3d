"""The ``triton_python_backend_utils`` module StreamRT gives Python models: Triton's names and behaviour,
DLPack in and out, and how a response's TritonError code becomes the request's status."""

from __future__ import annotations

import numpy as np
import pytest

from streamrt.errors import InferenceError, ModelNotReadyError, OutputMismatchError, RequestError
from streamrt.serve.configs.config import TensorConfig
from streamrt.serve.models.python_backend import pb_utils
from streamrt.serve.models.python_backend.responses import check_response, error_of
from streamrt.serve.wire.status import status_for
from streamrt.types import DType


def test_type_tables_match_tritons_numbering() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_type(np.float32) == 11 and pb_utils.numpy_to_triton_type(np.bool_) == 1
    assert pb_utils.numpy_to_triton_type(np.object_) == 13 and pb_utils.triton_to_numpy_type(9) is np.int64
    with pytest.raises(KeyError):
        pb_utils.triton_string_to_numpy("TYPE_NOPE")


def test_bytes_tensor_round_trip() -> None:
    items = np.array([b"a", b"", "\u00e9t\u00e9".encode(), b"\x00\x01"], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(items)
    assert encoded[:5] == b"\x01\x00\x00\x00a"
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == items.tolist()
    assert pb_utils.serialize_byte_tensor(np.zeros(0, np.object_)) == ()


def test_tensor_refuses_unicode_arrays_as_triton_does() -> None:
    with pytest.raises(pb_utils.TritonModelException, match=r"np\.object_"):
        pb_utils.Tensor("T", np.array(["abc"]))


def test_numpy_tensor_dlpack_round_trip_is_zero_copy() -> None:
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 3)).astype(np.float32)
    t = pb_utils.Tensor("X", x)
    back = pb_utils.Tensor.from_dlpack("Y", t.to_dlpack())
    assert back.name() == "Y" and back.is_cpu() and back.triton_dtype() == 11
    back.as_numpy()[0, 0] = 42.0
    assert x[0, 0] == 42.0  # the same memory


def test_torch_cpu_tensor_through_dlpack() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.dlpack import from_dlpack, to_dlpack

    source = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    t = pb_utils.Tensor.from_dlpack("OUT", to_dlpack(source))
    assert t.is_cpu() and t.as_numpy().tolist() == source.tolist() and t.triton_dtype() == 9
    assert pb_utils.Tensor.from_dlpack("OUT", source).as_numpy().tolist() == source.tolist()  # __dlpack__ objects
    assert from_dlpack(t.to_dlpack()).tolist() == source.tolist()
    with pytest.raises(pb_utils.TritonModelException, match="C-contiguous"):
        pb_utils.Tensor.from_dlpack("OUT", source.t())


def test_lookup_helpers_and_response() -> None:
    x = pb_utils.Tensor("X", np.ones(2, np.float32))
    request = pb_utils.InferenceRequest([x], "id-1", 0, ["Y"], {"k": 1})
    assert pb_utils.get_input_tensor_by_name(request, "X") is x
    assert pb_utils.get_input_tensor_by_name(request, "Z") is None
    assert request.request_id() == "id-1" and request.requested_output_names() == ["Y"]
    assert request.parameters() == '{"k": 1}'
    config = {"input": [{"name": "X", "data_type": "TYPE_FP32"}], "output": [{"name": "Y", "data_type": "TYPE_INT8"}]}
    assert pb_utils.get_output_config_by_name(config, "Y")["data_type"] == "TYPE_INT8"
    assert pb_utils.get_input_config_by_name(config, "Y") is None
    response = pb_utils.InferenceResponse(output_tensors=[x])
    assert pb_utils.get_output_tensor_by_name(response, "X") is x and not response.has_error()
    with pytest.raises(pb_utils.TritonModelException, match="must be a list"):
        pb_utils.InferenceResponse(output_tensors=x)  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException, match="business logic scripting"):
        request.exec()


@pytest.mark.parametrize("code, error, http", [
    (pb_utils.TritonError.INTERNAL, InferenceError, 500),
    (pb_utils.TritonError.INVALID_ARG, RequestError, 400),
    (pb_utils.TritonError.UNKNOWN, RequestError, 400),
    (pb_utils.TritonError.UNAVAILABLE, ModelNotReadyError, 503),
    (pb_utils.TritonError.NOT_FOUND, Exception, 404),
    (pb_utils.TritonError.UNSUPPORTED, Exception, 501),
])
def test_triton_error_codes_keep_tritons_status(code: int, error: type, http: int) -> None:
    mapped = error_of(pb_utils.TritonError("why", code))
    assert isinstance(mapped, error) and mapped.message == "why" and status_for(mapped).http == http
    assert status_for(error_of(pb_utils.TritonError("default"))).http == 500  # INTERNAL unless told


OUTPUTS = {"Y": TensorConfig("Y", DType.FLOAT32, (-1, 2))}


def _check(tensors: list[pb_utils.Tensor], rows: int | None = 3) -> object:
    return check_response(pb_utils.InferenceResponse(tensors), model="m", request_id="r", requested=("Y",),
                          outputs=OUTPUTS, rows=rows)


def test_response_checks_against_the_config() -> None:
    rng = np.random.default_rng()
    y = rng.standard_normal((3, 5, 2)).astype(np.float32)
    assert _check([pb_utils.Tensor("Y", y), pb_utils.Tensor("extra", y)])["Y"] is y  # type: ignore[index]
    assert _check([pb_utils.Tensor("Y", y[0])], rows=None)["Y"] is not None  # type: ignore[index]
    for tensors, words in (
        ([pb_utils.Tensor("Y", y.astype(np.float16))], "datatype FP16"),
        ([pb_utils.Tensor("Y", y[:2])], "shape [2, 5, 2]"),       # rows of another request
        ([pb_utils.Tensor("Y", y[..., :1])], "expects [3, -1, 2]"),
        ([], "no output 'Y'"),
    ):
        error = _check(tensors)
        assert isinstance(error, OutputMismatchError) and words in error.message, (words, error)
    none = check_response(None, model="m", request_id="", requested=("Y",), outputs=OUTPUTS, rows=1)
    assert isinstance(none, InferenceError) and "NoneType" in none.message


def test_device_tensor_to_host_copies_typed_tensors() -> None:
    torch = pytest.importorskip("torch")
    from streamrt.serve.models.python_backend.runner import on_device

    rng = np.random.default_rng()
    x = rng.standard_normal((2, 3)).astype(np.float32)
    wrapped = on_device(torch.from_numpy(x))  # what an ensemble caller gets for a device output
    assert wrapped.dtype == np.float32 and wrapped.shape == (2, 3)
    np.testing.assert_array_equal(np.asarray(wrapped), x)


@pytest.mark.parametrize("changes, words", [
    ({"output": []}, "must list its inputs and outputs"),
    ({"max_batch_size": 0}, "dynamic_batching needs max_batch_size >= 1"),
    ({"parameters": {"EXECUTION_ENV_PATH": {"string_value": "$$TRITON_MODEL_DIRECTORY/env.tar.gz"}}},
     "EXECUTION_ENV_PATH is not supported"),
    ({"input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4], "reshape": {"shape": [2, 2]}}]},
     "reshape is not supported"),
    ({"dynamic_batching": None, "sequence_batching": {"max_sequence_idle_microseconds": 1000000}},
     "sequence_batching is not supported"),
])
def test_python_configs_that_cannot_run_are_refused(changes: dict, words: str) -> None:
    from streamrt.errors import ConfigError
    from streamrt.serve.configs.config_message import from_mapping
    from streamrt.serve.models.python_backend import resolve_python_config

    base = {"backend": "python", "max_batch_size": 4, "dynamic_batching": {},
            "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}]}
    assert resolve_python_config(from_mapping(base, "m")).max_batch_size == 4
    with pytest.raises(ConfigError, match=words):
        resolve_python_config(from_mapping({**base, **changes}, "m"))


def test_auto_complete_model_config_checks_conflicts_as_triton() -> None:
    import json

    given = {"name": "m", "max_batch_size": 8, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}]}
    config = pb_utils.ModelConfig(json.dumps(given))
    config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [4]})  # agrees: nothing added
    config.add_output({"name": "Y", "data_type": "TYPE_INT8", "dims": [-1]})
    assert [t["name"] for t in config.as_dict()["input"]] == ["X"] and config.as_dict()["output"][0]["dims"] == [-1]
    with pytest.raises(ValueError, match="expects datatype TYPE_FP32"):
        config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [4]})
    with pytest.raises(ValueError, match="the model expects dims"):
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [5]})
    with pytest.raises(ValueError, match="missing 'dims'"):
        config.add_output({"name": "Z", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8"):
        config.set_max_batch_size(4)
