"""Bad input and failures: each gets the right status and message, and the server keeps serving."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.request
from typing import Any

import numpy as np
import pytest

from helpers import wait_until

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
                                                          "data": ["a"]}]}).encode(), {}, 400,
         "datatype BYTES, the model expects FP32"),
        ("/v2/models/nope/infer", infer_json(X), {}, 404,
         "Request for unknown model: 'nope' is not found"),
        ("/v2/models/cnn/versions/3/infer", infer_json(X), {}, 404, "'cnn' version 3 is not found"),
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
    flaky = behaviours["flaky"]
    flaky.gate, calls = threading.Semaphore(0), flaky.calls
    busy = threading.Thread(target=one)
    busy.start()
    wait_until(lambda: flaky.calls == calls + 1, "the busy request to run")
    one(timeout_us=50_000)  # queued behind a batch held by the gate: must time out while the gate is shut
    timed_out = [r for s, r in results if s == 503 and "timed out" in r.get("error", "")]
    flaky.gate.release()
    busy.join(30)
    assert timed_out and len(results) == 2, results


def pending_requests(server: Any, model: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no pending-request gauge for {model}")


def test_priority_levels_serve_high_priority_first(server: Any, behaviours: Any) -> None:
    # Event-driven, no timing margins: executions wait on a gate the test opens one at a time.
    slow = behaviours["slow"]
    slow.gate = threading.Semaphore(0)
    statuses: list[int] = []

    def one(value: float, priority: int) -> None:
        body = json.loads(infer_json(np.full((4, 3, 32, 32), value, np.float32)))  # a full batch: nothing combines
        body["parameters"] = {"priority": priority}
        status, _ = post(server, "/v2/models/slow/infer", json.dumps(body).encode())
        statuses.append(status)

    # Occupy both instances, then queue low (level 2) before high (level 1).
    threads = [threading.Thread(target=one, args=(float(i), 1)) for i in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: slow.calls == 2, "both instances to be busy")
    threads.append(threading.Thread(target=one, args=(20.0, 2)))
    threads[-1].start()
    wait_until(lambda: pending_requests(server, "slow") == 1, "the low-priority request to queue")
    threads.append(threading.Thread(target=one, args=(10.0, 1)))
    threads[-1].start()
    wait_until(lambda: pending_requests(server, "slow") == 2, "the high-priority request to queue")
    slow.gate.release()  # one instance frees up: the next execution must be the high-priority request
    wait_until(lambda: slow.calls == 3, "the next execution")
    assert slow.first_values[2] == 10.0, slow.first_values
    slow.gate.release(3)
    for t in threads:
        t.join(30)
    assert statuses == [200] * 4 and slow.first_values[3] == 20.0, (statuses, slow.first_values)


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

    from streamrt.serve.listeners.grpc_service import encode_grpc_response  # noqa: F401 - the module must import
    from streamrt.serve.wire.proto import SERVICE, messages

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


@pytest.mark.parametrize("frontend_processes", [1, 2], ids=["one-process", "2-frontend-processes"])
def test_auth_token(make_server: Any, frontend_processes: int) -> None:
    with make_server(auth_token="s3cret", startup_models=("cnn",), grpc_port=None, metrics_port=None,
                     frontend_processes=frontend_processes) as server:
        status, body = post(server, "/v2/models/cnn/infer", infer_json(X))
        assert status == 401 and "bearer token" in body["error"]
        assert post(server, "/v2/models/cnn/infer", infer_json(X), {"Authorization": "Bearer nope"})[0] == 401
        assert post(server, "/v2/models/cnn/infer", infer_json(X), {"Authorization": "Bearer s3cret"})[0] == 200
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
        conn.request("GET", "/v2/health/ready")  # probes need no token
        assert conn.getresponse().status == 200
        conn.close()
