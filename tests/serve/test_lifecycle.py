"""Batching and instances at work, metrics, readiness while loading, graceful shutdown, and a soak."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import wait_until

pytestmark = pytest.mark.timeout(180)


def post(port: int, model: str, x: np.ndarray, timeout: float = 30) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                       "data": x.ravel().tolist()}]})
        conn.request("POST", f"/v2/models/{model}/infer", body=body)
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def get_status(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def fan_out(n: int, fn: Any) -> list[Any]:
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        results[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_dynamic_batching_combines_concurrent_requests(server: Any, behaviours: Any) -> None:
    behaviours["flaky"].sleep = 0.05
    rng = np.random.default_rng()
    xs = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(6)]
    results = fan_out(6, lambda i: post(server.http_port, "flaky", xs[i]))
    assert all(s == 200 for s, _ in results)
    assert max(behaviours["flaky"].rows) > 1, behaviours["flaky"].rows  # some requests shared a batch
    assert sum(behaviours["flaky"].rows) == 6  # each request ran exactly once


def test_instances_overlap(server: Any, behaviours: Any) -> None:
    slow = behaviours["slow"]
    gate = slow.gate = threading.Semaphore(0)  # both executions must run at once before either may finish
    full = np.ones((4, 3, 32, 32), np.float32)

    def open_when_both_run() -> None:
        wait_until(lambda: slow.active == 2, "two concurrent executions")
        gate.release(2)

    opener = threading.Thread(target=open_when_both_run)
    opener.start()
    results = fan_out(2, lambda i: post(server.http_port, "slow", full))
    opener.join(30)
    assert all(s == 200 for s, _ in results)
    assert slow.max_active == 2


def test_metrics_have_tritons_names_and_values(server: Any) -> None:
    x = np.ones((2, 3, 32, 32), np.float32)
    assert post(server.http_port, "cnn", x)[0] == 200
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    stats = server.statistics("cnn")["model_stats"][0]

    def value(name: str, extra: str = "") -> float:
        match = re.search(rf'^{name}{{model="cnn",version="1"{extra}}} (\S+)$', text, re.M)
        assert match, name
        return float(match.group(1))

    assert value("nv_inference_request_success") == stats["inference_stats"]["success"]["count"]
    assert value("nv_inference_count") == stats["inference_count"]
    assert value("nv_inference_exec_count") == stats["execution_count"]
    assert value("nv_inference_compute_infer_duration_us") > 0
    assert value("nv_inference_request_failure", ',reason="BACKEND"') >= 0
    for name in ("nv_inference_queue_duration_us", "nv_inference_pending_request_count",
                 "nv_model_load_duration_secs", "nv_inference_request_duration_us"):
        value(name)
    assert "# TYPE nv_inference_request_success counter" in text and "nv_inference_request_success_total" not in text
    assert "# TYPE nv_gpu_utilization gauge" in text  # series only where NVML sees a GPU


def test_readiness_false_while_loading_and_warmup_before_ready(make_server: Any, behaviours: Any) -> None:
    slow = behaviours["slow"]
    slow.gate = threading.Semaphore(0)  # warm-up runs on the fake engine and waits here: still loading
    running = make_server(startup_models=("slow",), grpc_port=None, metrics_port=None)
    running._thread.start()
    running.call(running.server.start(wait_ready=False), timeout=30)
    try:
        port = running.server.http_port
        assert get_status(port, "/v2/health/live") == 200
        assert get_status(port, "/v2/health/ready") == 400
        assert get_status(port, "/v2/models/slow/ready") == 400
        assert post(port, "slow", np.ones((1, 3, 32, 32), np.float32))[0] == 503
        slow.gate.release(100)
        wait_until(lambda: get_status(port, "/v2/health/ready") == 200, "the server to be ready")
        assert get_status(port, "/v2/models/slow/ready") == 200
        assert behaviours["slow"].calls >= 2  # warm-up ran on both instances before READY
    finally:
        running.stop()


def test_graceful_shutdown_finishes_in_flight_then_refuses(make_server: Any, behaviours: Any) -> None:
    running = make_server(startup_models=("slow",), metrics_port=None).start()
    slow = behaviours["slow"]
    slow.gate, calls = threading.Semaphore(0), slow.calls
    port = running.server.http_port
    results: list[Any] = []
    client = threading.Thread(target=lambda: results.append(post(port, "slow", np.ones((1, 3, 32, 32), np.float32))))
    client.start()
    wait_until(lambda: slow.calls == calls + 1, "the request to run")
    stopper = threading.Thread(target=running.stop)
    stopper.start()
    wait_until(lambda: get_status(port, "/v2/health/ready") != 200, "the server to start stopping")
    assert post(port, "slow", np.ones((1, 3, 32, 32), np.float32))[0] == 503  # stopping: refused
    slow.gate.release()
    client.join(30)
    stopper.join(30)
    assert results and results[0][0] == 200  # the in-flight request finished
    with pytest.raises(OSError):
        post(port, "slow", np.ones((1, 3, 32, 32), np.float32), timeout=2)


def test_onnx_model_built_on_load_and_version_policy(server: Any, tmp_path: Path) -> None:
    status, body = post(server.http_port, "onnx_cnn", np.ones((4, 3, 32, 32), np.float32))
    assert status == 200 and body["outputs"][0]["shape"] == [4, 10]
    assert server.statistics("onnx_cnn")["model_stats"][0]["execution_count"] >= 1


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_soak_no_lost_or_duplicated_responses_and_flat_memory(server: Any, reference: Any) -> None:
    """8 clients x 4 s of unique requests: every answer matches its own input; RSS stays flat."""
    import tritonclient.http as thttp

    def client(i: int, seconds: float) -> tuple[int, int]:
        rng = np.random.default_rng(i)
        c = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30)
        sent = ok = 0
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                n = int(rng.integers(1, 4))
                x = rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
                inp = thttp.InferInput("x", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                sent += 1
                out = c.infer("cnn", [inp], request_id=f"{i}-{sent}")
                assert out.get_response()["id"] == f"{i}-{sent}"
                np.testing.assert_allclose(out.as_numpy("logits"), reference("small_cnn", {"x": x})["logits"],
                                           rtol=1e-4, atol=1e-5)
                ok += 1
        finally:
            c.close()
        return sent, ok

    before_stats = server.statistics("cnn")["model_stats"][0]["inference_stats"]["success"]["count"]
    fan_out(8, lambda i: client(i, 1.0))  # warm: allocator and slot caches settle
    rss0 = _rss_mb()
    results = fan_out(8, lambda i: client(100 + i, 4.0))
    rss1 = _rss_mb()
    sent = sum(r[0] for r in results)
    assert all(r is not None and r[0] == r[1] for r in results), results
    after_stats = server.statistics("cnn")["model_stats"][0]["inference_stats"]["success"]["count"]
    assert after_stats - before_stats >= sent  # the server counted every request exactly once (plus warm-up)
    assert rss1 - rss0 < 40, (rss0, rss1)
