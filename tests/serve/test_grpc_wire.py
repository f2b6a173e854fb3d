"""The hand-rolled protobuf path of ModelInfer: split/encode agree with protobuf, malformed bytes are a
clean 400, and the gRPC message limit: 64-image (38.5 MB) requests pass by default, larger than
``grpc_max_message_bytes`` is RESOURCE_EXHAUSTED."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from streamrt.errors import RequestError, UnparsableRequestError
from streamrt.serve import ServerConfig, ServerThread
from streamrt.serve.listeners.grpc_service import parse_infer_request, serialize_grpc_response
from streamrt.serve.wire.grpc_wire import encode_length_delimited, split_infer_request
from streamrt.serve.wire.proto import messages as m
from streamrt.serve.wire.protocol import InferResponse

pytestmark = pytest.mark.timeout(180)


def _request(rng: np.random.Generator, n: int = 3) -> tuple[Any, list[np.ndarray]]:
    arrays = [rng.standard_normal((2, 5 + i)).astype(np.float32) for i in range(n)]
    msg = m.ModelInferRequest(model_name="mod", model_version="2", id="r1")
    msg.parameters["priority"].int64_param = 1
    for i, a in enumerate(arrays):
        msg.inputs.add(name=f"in{i}", datatype="FP32", shape=list(a.shape))
        msg.raw_input_contents.append(a.tobytes())
    msg.outputs.add(name="y")
    return msg, arrays


def test_split_agrees_with_protobuf_in_any_field_order() -> None:
    rng = np.random.default_rng()
    msg, arrays = _request(rng)
    # Protobuf writes fields in number order; a valid message may interleave them (concatenation merges).
    head = m.ModelInferRequest(model_name="mod", raw_input_contents=[arrays[0].tobytes()]).SerializeToString()
    tail = m.ModelInferRequest(model_version="2", id="r1", inputs=msg.inputs, outputs=msg.outputs,
                               parameters=msg.parameters,
                               raw_input_contents=[a.tobytes() for a in arrays[1:]]).SerializeToString()
    for data in (msg.SerializeToString(), head + tail):
        rest, raw = split_infer_request(data)
        parsed = m.ModelInferRequest.FromString(rest)
        assert (parsed.model_name, parsed.model_version, parsed.id) == ("mod", "2", "r1")
        assert not parsed.raw_input_contents and len(parsed.inputs) == 3
        assert [bytes(r) for r in raw] == [a.tobytes() for a in arrays]
        request = parse_infer_request(data, 10**6)
        for i, a in enumerate(arrays):
            np.testing.assert_array_equal(request.inputs[f"in{i}"], a)
        assert request.priority == 1 and request.id == "r1"


def test_large_requests_are_zero_copy_views() -> None:
    rng = np.random.default_rng()
    x = rng.standard_normal((8, 3, 64, 64)).astype(np.float32)
    msg = m.ModelInferRequest(model_name="mod")
    msg.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    msg.raw_input_contents.append(x.tobytes())
    data = msg.SerializeToString()
    request = parse_infer_request(data, 10**8)
    np.testing.assert_array_equal(request.inputs["x"], x)
    assert np.shares_memory(request.inputs["x"], np.frombuffer(data, np.uint8))


@pytest.mark.parametrize("cut", [1, 7, -3])
def test_malformed_bytes_are_request_errors(cut: int) -> None:
    msg, _ = _request(np.random.default_rng(), 1)
    data = msg.SerializeToString()
    with pytest.raises(RequestError, match="malformed"):
        split_infer_request(data[:cut] if cut > 0 else data[:cut] + b"\xff")


def test_response_bytes_match_protobuf() -> None:
    rng = np.random.default_rng()
    outputs = {"a": rng.standard_normal((2, 3)).astype(np.float32), "b": np.arange(4, dtype=np.int64)}
    data = serialize_grpc_response(InferResponse("mod", "1", "id7", outputs))
    parsed = m.ModelInferResponse.FromString(data)
    assert (parsed.model_name, parsed.id, [o.name for o in parsed.outputs]) == ("mod", "id7", ["a", "b"])
    assert parsed.raw_output_contents[0] == outputs["a"].tobytes()
    assert parsed.raw_output_contents[1] == outputs["b"].tobytes()
    stream = m.ModelStreamInferResponse.FromString(encode_length_delimited(2, data))
    assert stream.infer_response == parsed


def _small(model: str, x: np.ndarray, request_id: str = "", **tensor: Any) -> bytes:
    msg = m.ModelInferRequest(model_name=model, id=request_id)
    msg.inputs.add(name="x", datatype="FP32", shape=list(x.shape), **tensor)
    msg.raw_input_contents.append(x.tobytes())
    return msg.SerializeToString()


def test_a_remembered_request_layout_gives_the_full_decode_of_each_request() -> None:
    """The second request of a shape is looked up (grpc_layouts); it must decode as the first did,
    with its own tensor bytes, and a request whose raw entry has another size must still be refused."""
    from streamrt.serve.wire import grpc_layouts

    rng = np.random.default_rng()
    model = f"layout_{rng.integers(1 << 30)}"  # a rest no other test remembered
    first, second = (rng.standard_normal((1, 16)).astype(np.float32) for _ in range(2))
    a = parse_infer_request(_small(model, first, "r1"), 10**6)
    assert grpc_layouts.known_request(*split_infer_request(_small(model, second, "r1")), 10**6) is not None
    b = parse_infer_request(_small(model, second, "r1"), 10**6)
    assert (b.model, b.id, b.outputs, b.sequence, b.priority) == (a.model, a.id, a.outputs, a.sequence, a.priority)
    np.testing.assert_array_equal(b.inputs["x"], second)
    assert b.inputs["x"].shape == (1, 16) and b.inputs["x"].dtype == np.float32
    short = m.ModelInferRequest.FromString(_small(model, second, "r1"))
    short.raw_input_contents[0] = second.tobytes()[:-4]
    with pytest.raises(RequestError, match="raw_input_contents has 60 bytes"):
        parse_infer_request(short.SerializeToString(), 10**6)
    with pytest.raises(RequestError, match="exceed the server limit"):  # the limit is part of the key
        parse_infer_request(_small(model, second, "r1"), 8)


def test_numbered_requests_share_one_layout_and_keep_their_own_ids() -> None:
    """Clients that number their requests send a new id each time: the id is not part of the remembered
    layout, so the second request of a shape is looked up whatever its id (ids of other lengths, non-ASCII,
    over 127 bytes, none), on both lookups, and answers with its own id; an id that is not UTF-8 is still
    refused as protobuf refuses it."""
    from streamrt.serve.wire import grpc_layouts

    rng = np.random.default_rng()
    model = f"ids_{rng.integers(1 << 30)}"
    parse_infer_request(_small(model, np.ones((1, 16), np.float32), "first"), 10**6)
    for request_id in ("2", "request-00017", "é" * 90, "", "x" * 300):
        x = rng.standard_normal((1, 16)).astype(np.float32)
        data = _small(model, x, request_id)
        whole = grpc_layouts.known_whole_request(data, 10**6)
        split = grpc_layouts.known_request(*split_infer_request(data), 10**6)
        assert whole is not None and split is not None, request_id
        for request in (whole, split, parse_infer_request(data, 10**6)):
            assert (request.model, request.id) == (model, request_id)
            np.testing.assert_array_equal(request.inputs["x"], x)
    whole_message = _small(model, np.ones((1, 16), np.float32), "x" * 200)
    for cut in range(len(whole_message)):  # cut anywhere (inside the id's two-byte length too): not known, no error
        assert grpc_layouts.known_whole_request(whole_message[:cut], 10**6) is None
    bad = bytearray(_small(model, np.ones((1, 16), np.float32), "ab"))
    bad[bad.index(b"ab")] = 0xFF  # the id's first byte: not UTF-8
    assert grpc_layouts.known_whole_request(bytes(bad), 10**6) is None
    with pytest.raises(UnparsableRequestError):
        parse_infer_request(bytes(bad), 10**6)


def test_requests_with_parameters_are_decoded_every_time() -> None:
    """Sequence requests differ by their ids and flags (and shared memory by more than the message
    bytes): never remembered."""
    from streamrt.serve.wire import grpc_layouts

    x = np.ones((1, 16), np.float32)
    msg = m.ModelInferRequest.FromString(_small("params", x))
    msg.parameters["sequence_id"].int64_param = 5
    msg.parameters["sequence_start"].bool_param = True
    for _ in range(2):
        request = parse_infer_request(msg.SerializeToString(), 10**6)
        assert request.sequence is not None and request.sequence.start
    assert grpc_layouts.known_request(*split_infer_request(msg.SerializeToString()), 10**6) is None


def test_request_level_parameters_are_remembered_with_their_priority_and_timeout() -> None:
    """perf_analyzer sends ``triton_enable_empty_final_response`` with every request: a request-level
    parameter that is not a sequence's keeps the layout, and a looked-up request gets the priority and
    timeout its rest asked for, as the full decode gives them."""
    from streamrt.serve.wire import grpc_layouts

    rng = np.random.default_rng()
    model = f"params_{rng.integers(1 << 30)}"
    msg = m.ModelInferRequest.FromString(_small(model, np.ones((1, 16), np.float32), "r1"))
    msg.parameters["triton_enable_empty_final_response"].bool_param = True
    msg.parameters["priority"].int64_param = 2
    msg.parameters["timeout"].int64_param = 7000
    full = parse_infer_request(msg.SerializeToString(), 10**6)
    x = rng.standard_normal((1, 16)).astype(np.float32)
    msg.raw_input_contents[0] = x.tobytes()
    msg.id = "r2"
    data = msg.SerializeToString()
    for known in (grpc_layouts.known_whole_request(data, 10**6),
                  grpc_layouts.known_request(*split_infer_request(data), 10**6)):
        assert known is not None
        assert (known.model, known.id, known.priority, known.timeout_us, known.sequence, known.outputs) == \
            (model, "r2", 2, 7000, None, full.outputs)
        np.testing.assert_array_equal(known.inputs["x"], x)
    with pytest.raises(RequestError, match="'priority' and 'timeout'"):  # a bad value is never remembered
        msg.parameters["priority"].int64_param = -1
        parse_infer_request(msg.SerializeToString(), 10**6)


def test_remembered_reply_headers_write_protobuf_bytes() -> None:
    """A reply written from the remembered header is byte for byte protobuf's, with and without an id."""
    rng = np.random.default_rng()
    for request_id in ("", "id-9", "é" * 100, ""):
        outputs = {"y": rng.standard_normal((2, 1)).astype(np.float32), "z": np.arange(6).reshape(2, 3)}
        expected = m.ModelInferResponse(model_name="mod", model_version="3", id=request_id)
        for name, array in outputs.items():
            expected.outputs.add(name=name, datatype="FP32" if array.dtype == np.float32 else "INT64",
                                 shape=list(array.shape))
            expected.raw_output_contents.append(array.tobytes())
        assert serialize_grpc_response(InferResponse("mod", "3", request_id, outputs)) == expected.SerializeToString()


def _null_repo(root: Path) -> Path:
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1, 2, 3], keepdims=0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 224, 224])
    graph = helper.make_graph([node], "null", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (root / "null" / "1").mkdir(parents=True)
    onnx.save(model, str(root / "null" / "1" / "model.onnx"))
    (root / "null" / "config.yaml").write_text("max_batch_size: 64\n")
    return root


def test_64_image_requests_pass_and_the_limit_is_resource_exhausted(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import tritonclient.grpc as tgrpc
    from tritonclient.utils import InferenceServerException

    monkeypatch.setenv("STREAMRT_CACHE", str(tmp_path / "cache"))
    repo = _null_repo(tmp_path / "repo")
    x = np.random.default_rng().standard_normal((64, 3, 224, 224)).astype(np.float32)
    cfg = ServerConfig(http_port=None, grpc_port=0, metrics_port=None, exit_timeout_s=5)
    with ServerThread(repo, cfg, start_timeout=120) as server:
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        inp = tgrpc.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        y = client.infer("null", [inp]).as_numpy("y")
        np.testing.assert_allclose(y, x.reshape(64, -1).mean(axis=1, dtype=np.float64), rtol=1e-4, atol=1e-6)
        client.close()
    with ServerThread(repo, cfg.replace(grpc_max_message_bytes=2**20), start_timeout=120) as server:
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        small = tgrpc.InferInput("x", [4, 3, 224, 224], "FP32")
        small.set_data_from_numpy(x[:4])
        with pytest.raises(InferenceServerException, match="larger than max"):
            client.infer("null", [small])
        client.close()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "bool", "int64", "uint8", "complex64"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "empty", "scalar"])
def test_raw_bytes_are_the_tensors_memory_in_c_order(dtype: str, layout: str) -> None:
    """``raw_bytes``: the bytes ``tobytes`` gives (C order), a view where the array is C-contiguous; formats
    the buffer protocol lacks (bfloat16) go through a uint8 view; an empty output (a detector with no boxes)
    and a 0-d one are answered too."""
    from streamrt.serve.wire.protocol import raw_bytes

    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        np_dtype: Any = ml_dtypes.bfloat16
    else:
        np_dtype = np.dtype(dtype)
    array = (np.random.default_rng(0).standard_normal((3, 5)) * 10).astype(np_dtype)
    array = {"transposed": array.T, "empty": array[:0], "scalar": array[0, 0].reshape(())}.get(layout, array)
    blob = raw_bytes(array)
    assert bytes(blob) == array.tobytes() and len(blob) == array.nbytes
    if layout == "contiguous":
        assert isinstance(blob, memoryview) and np.shares_memory(np.frombuffer(blob, np.uint8), array)
