"""Bad input and failures: each gets the right status and message, and the server keeps serving."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(120)

HDR = "Inference-Header-Content-Length"


def post(server: Any, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        length = response.getheader(HDR)
        text = data[: int(length)] if length else data
        return response.status, json.loads(text) if text else {}
    finally:
        conn.close()


def infer_json(x: np.ndarray, name: str = "x", datatype: str = "FP32") -> bytes:
    return json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": datatype,
                                   "data": x.ravel().tolist()}]}).encode()


def binary_body(x: np.ndarray, size: int | None = None, extra: bytes = b"") -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes if size is None else size}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return header + x.tobytes() + extra, {HDR: str(len(header))}


def assert_serving(server: Any) -> None:
    x = np.random.default_rng().standard_normal((1, 3, 32, 32)).astype(np.float32)
    status, body = post(server, "/v2/models/cnn/infer", infer_json(x))
    assert status == 200, body
    assert body["outputs"][0]["shape"] == [1, 10]


X = np.ones((1, 3, 32, 32), np.float32)


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "words"),
    [
        ("/v2/models/cnn/infer", b"{not json", {}, 400, "malformed JSON"),
        ("/v2/models/cnn/infer", b"[1, 2]", {}, 400, "JSON object"),
        ("/v2/models/cnn/infer", b'{"inputs": []}', {}, 400, "non-empty 'inputs'"),
        ("/v2/models/cnn/infer", *binary_body(X, size=X.nbytes - 4), 400, "binary_data_size"),
        ("/v2/models/cnn/infer", *binary_body(X, extra=b"\0" * 8), 400, "do not add up"),
        ("/v2/models/cnn/infer", X.tobytes()[:100], {HDR: "999999"}, 400, "body has"),
        ("/v2/models/cnn/infer", infer_json(X.astype(np.int32), datatype="INT32"), {}, 400, "INT32"),
        ("/v2/models/cnn/infer", infer_json(np.ones((1, 3, 16, 16), np.float32)), {}, 400, "shape"),
        ("/v2/models/cnn/infer", infer_json(np.ones((9, 3, 32, 32), np.float32)), {}, 400, "max_batch_size"),
        ("/v2/models/cnn/infer", infer_json(X, name="y"), {}, 400, "unknown input 'y'"),
        ("/v2/models/pair/infer", infer_json(np.ones((1, 10), np.float32), name="a"), {}, 400, "needs input 'b'"),
        ("/v2/models/cnn/infer", json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 32, 32], "datatype": "FP32",
                                                          "data": [1, 2]}]}).encode(), {}, 400, "elements"),
        ("/v2/models/cnn/infer", json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES",
                                                          "data": ["a"]}]}).encode(), {}, 501, "BYTES"),
        ("/v2/models/nope/infer", infer_json(X), {}, 404, "unknown model 'nope'"),
        ("/v2/models/cnn/versions/3/infer", infer_json(X), {}, 404, "unknown version '3'"),
        ("/v2/models/broken/infer", infer_json(X), {}, 503, "broken"),
        ("/v2/models/cnn/infer", json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 32, 32], "datatype": "FP32",
                                                          "data": X.ravel().tolist()}],
                                              "outputs": [{"name": "nope"}]}).encode(), {}, 400, "unknown output"),
        ("/v2/models/slow/infer", json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 32, 32], "datatype": "FP32",
                                                           "data": X.ravel().tolist()}],
                                               "parameters": {"priority": 5}}).encode(), {}, 400, "priority 5"),
    ],
)
def test_bad_requests(server: Any, path: str, body: bytes, headers: dict[str, str], status: int, words: str) -> None:
    got, reply = post(server, path, body, headers)
    assert got == status, reply
    assert words in reply["error"], reply
    assert_serving(server)


def test_oversized_body_and_too_many_elements(server: Any) -> None:
    limit = server.config.max_request_bytes
    got, reply = post(server, "/v2/models/cnn/infer", b"x" * (limit + 1))
    assert got == 413 and "limit" in reply["error"]
    old = server.server.config
    server.server.config = old.replace(max_tensor_elements=1000)
    try:
        got, reply = post(server, "/v2/models/cnn/infer", infer_json(X))
        assert got == 413 and "3072 elements exceed the server limit of 1000" in reply["error"]
    finally:
        server.server.config = old
    assert_serving(server)


def test_engine_failure_mid_batch_fails_every_request_of_the_batch(server: Any, behaviours: Any) -> None:
    behaviours["flaky"].fail = True
    behaviours["flaky"].sleep = 0.05
    results: list[tuple[int, dict[str, Any]]] = []

    def one() -> None:
        results.append(post(server, "/v2/models/flaky/infer", infer_json(X)))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 4
    assert all(s == 500 and "injected engine failure" in r["error"] for s, r in results)
    behaviours["flaky"].fail = False
    assert post(server, "/v2/models/flaky/infer", infer_json(X))[0] == 200
    stats = server.statistics("flaky")["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] >= 4


def test_queue_full_and_timeouts_are_rejected_with_a_message(server: Any, behaviours: Any) -> None:
    behaviours["flaky"].sleep = 0.4
    results: list[tuple[int, dict[str, Any]]] = []
    lock = threading.Lock()

    def one(timeout_us: int = 0) -> None:
        body = json.loads(infer_json(X))
        if timeout_us:
            body["parameters"] = {"timeout": timeout_us}
        r = post(server, "/v2/models/flaky/infer", json.dumps(body).encode())
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    codes = sorted(s for s, _ in results)
    assert len(codes) == 16 and 200 in codes and 503 in codes
    assert any("maximum of 6 requests" in r.get("error", "") for _, r in results)
    results.clear()
    behaviours["flaky"].sleep = 0.5
    busy = threading.Thread(target=one)
    busy.start()
    time.sleep(0.1)
    started = time.monotonic()
    one(timeout_us=50_000)  # queued behind a 0.5 s batch: must time out on time, not after it
    elapsed = time.monotonic() - started
    busy.join(30)
    timed_out = [r for s, r in results if s == 503 and "timed out" in r.get("error", "")]
    assert timed_out and elapsed < 0.45, (results, elapsed)


def test_priority_levels_serve_high_priority_first(server: Any, behaviours: Any) -> None:
    # Generous margins: on a loaded 2-core CI machine thread start-up can take a tenth of a second.
    behaviours["slow"].sleep = 1.0
    order: list[str] = []
    lock = threading.Lock()

    full = np.ones((4, 3, 32, 32), np.float32)  # a full batch each: nothing combines

    def one(tag: str, priority: int) -> None:
        body = json.loads(infer_json(full))
        body["parameters"] = {"priority": priority}
        status, _ = post(server, "/v2/models/slow/infer", json.dumps(body).encode())
        assert status == 200
        with lock:
            order.append(tag)

    # Two instances; occupy both, then queue low before high: high must run first.
    blockers = [threading.Thread(target=one, args=(f"b{i}", 1)) for i in range(2)]
    for t in blockers:
        t.start()
    time.sleep(0.35)
    low = threading.Thread(target=one, args=("low", 2))
    low.start()
    time.sleep(0.3)
    high = threading.Thread(target=one, args=("high", 1))
    high.start()
    for t in [*blockers, low, high]:
        t.join(30)
    assert order.index("high") < order.index("low"), order


def test_client_disconnects_mid_request(server: Any, behaviours: Any) -> None:
    body, headers = binary_body(X)
    # 1: the client sends half the body and goes away.
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as s:
        head = (f"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                f"{HDR}: {headers[HDR]}\r\n\r\n").encode()
        s.sendall(head + body[: len(body) // 2])
    # 2: the client sends a request to a slow model and goes away before the answer.
    behaviours["flaky"].sleep = 0.3
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as s:
        head = (f"POST /v2/models/flaky/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                f"{HDR}: {headers[HDR]}\r\n\r\n").encode()
        s.sendall(head + body)
        time.sleep(0.05)
    # 3: a gRPC client gives up (deadline) while its request waits.
    import grpc

    from streamrt.serve.grpc_service import encode_grpc_response  # noqa: F401 - the module must import
    from streamrt.serve.proto import SERVICE, messages

    request = messages.ModelInferRequest(model_name="flaky")
    request.inputs.add(name="x", datatype="FP32", shape=list(X.shape))
    request.raw_input_contents.append(X.tobytes())
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.unary_unary(f"/{SERVICE}/ModelInfer", request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=messages.ModelInferResponse.FromString)
        with pytest.raises(grpc.RpcError) as err:
            call(request, timeout=0.05)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    time.sleep(0.4)
    behaviours["flaky"].sleep = 0.0
    assert post(server, "/v2/models/flaky/infer", infer_json(X))[0] == 200
    assert_serving(server)


def test_auth_token(make_server: Any) -> None:
    with make_server(auth_token="s3cret", startup_models=("cnn",), grpc_port=None, metrics_port=None) as server:
        status, body = post(server, "/v2/models/cnn/infer", infer_json(X))
        assert status == 401 and "bearer token" in body["error"]
        assert post(server, "/v2/models/cnn/infer", infer_json(X), {"Authorization": "Bearer nope"})[0] == 401
        assert post(server, "/v2/models/cnn/infer", infer_json(X), {"Authorization": "Bearer s3cret"})[0] == 200
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
        conn.request("GET", "/v2/health/ready")  # probes need no token
        assert conn.getresponse().status == 200
        conn.close()
