"""The remembered HTTP headers (serve/wire/http_headers.py): a repeated header decodes and encodes
exactly as the full parse does, on the new body's bytes, and anything not safe to keep is not kept."""

from __future__ import annotations

import json

import numpy as np
import pytest

from streamrt.errors import RequestError
from streamrt.serve.wire import protocol
from streamrt.serve.wire.http_headers import MAX_HEADER_BYTES, BoundedTable
from streamrt.serve.wire.protocol import InferRequest, InferResponse, decode_http_request, encode_http_response


def _binary_body(arrays: dict[str, np.ndarray], outputs: list[dict[str, object]] | None = None,
                 **params: object) -> tuple[bytes, int]:
    entries = [{"name": n, "shape": list(a.shape), "datatype": "FP32" if a.dtype == np.float32 else "INT64",
                "parameters": {"binary_data_size": a.nbytes}} for n, a in arrays.items()]
    message: dict[str, object] = {"inputs": entries, "parameters": {"binary_data_output": True, **params}}
    if outputs is not None:
        message["outputs"] = outputs
    header = json.dumps(message).encode()
    return header + b"".join(a.tobytes() for a in arrays.values()), len(header)


def _decode(body: bytes | memoryview, length: int | None) -> InferRequest:
    return decode_http_request(body, length, model="m", version="2", max_elements=10**6)


def test_a_repeated_header_reads_the_new_body() -> None:
    rng = np.random.default_rng()
    first = {"x": rng.standard_normal((2, 16), dtype=np.float32), "k": rng.integers(0, 99, (2, 3))}
    second = {"x": rng.standard_normal((2, 16), dtype=np.float32), "k": rng.integers(0, 99, (2, 3))}
    outputs = [{"name": "y", "parameters": {"binary_data": False}}, {"name": "z", "parameters": {"classification": 2}}]
    body1, length = _binary_body(first, outputs, priority=2, timeout=500, sequence_id=7, sequence_start=True)
    body2, length2 = _binary_body(second, outputs, priority=2, timeout=500, sequence_id=7, sequence_start=True)
    assert length == length2
    protocol._LAYOUTS = BoundedTable()
    parsed = _decode(body1, length)
    assert len(protocol._LAYOUTS) == 1
    buffer = np.frombuffer(body2, np.uint8).copy()  # a server's body buffer
    again = _decode(buffer.data.cast("B"), length)
    for name, array in second.items():
        np.testing.assert_array_equal(again.inputs[name], array)
        assert again.inputs[name].dtype == array.dtype and np.shares_memory(again.inputs[name], buffer)
    for field in ("model", "version", "id", "outputs", "binary_output", "priority", "timeout_us", "sequence"):
        assert getattr(again, field) == getattr(parsed, field), field
    assert again.leases == [] and again.leases is not parsed.leases
    assert [(o.name, o.binary, o.class_count) for o in again.outputs] == [("y", False, 0), ("z", None, 2)]
    assert again.priority == 2 and again.timeout_us == 500 and again.sequence is not None


def _numbered(arrays: dict[str, np.ndarray], request_id: object, separators: tuple[str, str] = (", ", ": ")
              ) -> tuple[bytes, int]:
    """A body whose JSON header has the id first, as tritonclient and streamrt perf write it."""
    entries = [{"name": n, "shape": list(a.shape), "datatype": "FP32", "parameters": {"binary_data_size": a.nbytes}}
               for n, a in arrays.items()]
    header = json.dumps({"id": request_id, "inputs": entries}, separators=separators).encode()
    return header + b"".join(a.tobytes() for a in arrays.values()), len(header)


def test_numbered_requests_share_one_layout_and_keep_their_own_ids() -> None:
    """A new id each time (other lengths, non-ASCII, compact JSON) is looked up, not parsed: the tensors are read
    where the longer or shorter header puts them, and each request keeps its id; ids the bytes do not give as they
    are (escapes) take the full parse, with the same answer."""
    rng = np.random.default_rng()
    protocol._LAYOUTS = BoundedTable()
    _decode(*_numbered({"x": np.ones((1, 16), np.float32), "w": np.ones((1, 3), np.float32)}, "first"))
    for request_id in ("2", "request-000017", "é" * 40, "", "x" * 300):
        arrays = {"x": rng.standard_normal((1, 16), dtype=np.float32), "w": rng.standard_normal((1, 3), np.float32)}
        body, length = _numbered(arrays, request_id)
        protocol._LAYOUTS.put = None  # type: ignore[method-assign,assignment]  # a full parse would fail here
        try:
            request = _decode(body, length)
        finally:
            del protocol._LAYOUTS.put
        assert request.id == request_id
        for name, array in arrays.items():
            np.testing.assert_array_equal(request.inputs[name], array)
        with pytest.raises(RequestError, match="binary data ends at byte"):  # a short body: the full parse's error
            _decode(body[:-4], length)
    assert len(protocol._LAYOUTS) == 1
    x = np.ones((1, 16), np.float32)
    for odd in ('a\\"b', 'tab\there'):  # escapes: not read from the bytes, parsed (and right)
        body, length = _numbered({"x": x, "w": x[:, :3]}, odd)
        assert _decode(body, length).id == odd
    compact = _numbered({"x": x}, "c1", separators=(",", ":"))
    assert _decode(*compact).id == "c1" and _decode(*_numbered({"x": x}, "c22", separators=(",", ":"))).id == "c22"


def test_a_known_header_with_a_short_body_gets_the_full_parse_error() -> None:
    x = np.random.default_rng().standard_normal((1, 16), dtype=np.float32)
    body, length = _binary_body({"x": x})
    protocol._LAYOUTS = BoundedTable()
    _decode(body, length)
    with pytest.raises(RequestError, match="binary data ends at byte"):
        _decode(body[:-4], length)


def test_headers_with_json_data_bytes_shared_memory_or_over_4_kib_are_not_kept() -> None:
    protocol._LAYOUTS = BoundedTable()
    x = np.random.default_rng().standard_normal((1, 4), dtype=np.float32)
    body, length = _binary_body({"x": x}, note="n" * MAX_HEADER_BYTES)  # a long request parameter
    np.testing.assert_array_equal(_decode(body, length).inputs["x"], x)
    _decode(b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]}]}', None)
    words = b"\x02\x00\x00\x00hi"
    header = json.dumps({"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(words)}}]}).encode()
    assert _decode(header + words, len(header)).inputs["s"].tolist() == [b"hi"]
    assert len(protocol._LAYOUTS) == 0


def _expected(model: str, version: str, request_id: str, outputs: dict[str, np.ndarray]) -> bytes:
    entries = [{"name": n, "datatype": {"float32": "FP32", "int64": "INT64"}[str(a.dtype)], "shape": list(a.shape),
                "parameters": {"binary_data_size": a.nbytes}} for n, a in outputs.items()]
    header: dict[str, object] = {"model_name": model, "model_version": version, "outputs": entries}
    if request_id:
        header["id"] = request_id
    return json.dumps(header, separators=(",", ":")).encode()


@pytest.mark.parametrize("request_id", ["", "r-1", 'é"\\'])
def test_binary_replies_are_byte_for_byte_the_full_encoding(request_id: str) -> None:
    rng = np.random.default_rng()
    protocol._REPLY_HEADERS = BoundedTable()
    request = InferRequest("m", binary_output=True)
    for _ in range(3):  # the first writes the header, the others reuse it
        outputs = {"y": rng.standard_normal((2, 1), dtype=np.float32), "z": rng.integers(0, 9, (2, 4))}
        body, length = encode_http_response(InferResponse("m", "2", request_id, outputs), request)
        header = _expected("m", "2", request_id, outputs)
        assert length == len(header) and body == header + outputs["y"].tobytes() + outputs["z"].tobytes()
    assert len(protocol._REPLY_HEADERS) == 1


def test_replies_with_json_data_or_bytes_are_not_kept() -> None:
    protocol._REPLY_HEADERS = BoundedTable()
    y = np.random.default_rng().standard_normal((1, 2), dtype=np.float32)
    body, length = encode_http_response(InferResponse("m", "1", "", {"y": y}), InferRequest("m"))
    assert length is None and json.loads(body)["outputs"][0]["data"] == y.ravel().tolist()
    words = np.array([b"ab", b"c"], dtype=object)
    body, length = encode_http_response(InferResponse("m", "1", "", {"s": words}),
                                        InferRequest("m", binary_output=True))
    assert length is not None and body[length:] == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c"
    assert len(protocol._REPLY_HEADERS) == 0


def test_a_full_table_starts_over() -> None:
    table: BoundedTable[int] = BoundedTable(limit=2)
    table.put("a", 1)
    table.put("b", 2)
    table.put("c", 3)
    assert len(table) == 1 and table.get("c") == 3 and table.get("a") is None
