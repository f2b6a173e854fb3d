"""StreamRT inside Ray Serve on a local two-node Ray cluster (CPU): v2 health and infer at the edge,
replicas spread over nodes, and a replica killed mid-load with every request accounted for.

Skipped when ``ray[serve]`` is not installed (it is the optional ``ray`` extra).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from streamrt.integrations.ray_serve import streamrt_app  # noqa: E402
from streamrt.testing.models import CATALOGUE  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray-repo")
    (root / "cnn" / "1").mkdir(parents=True)
    onnx.save(CATALOGUE["small_cnn"].make(), str(root / "cnn" / "1" / "model.onnx"))
    (root / "cnn" / "config.yaml").write_text(
        "max_batch_size: 8\ndynamic_batching: {max_queue_delay_microseconds: 2000}\n")
    return root


@pytest.fixture(scope="module")
def cluster() -> Iterator[int]:
    """A head and a worker node (2 logical CPUs each) and Serve's proxy on a free loopback port."""
    nodes = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    nodes.add_node(num_cpus=2)
    nodes.wait_for_nodes()
    ray.init(address=nodes.address, include_dashboard=False, log_to_driver=False)
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()
        nodes.shutdown()


def _request(port: int, method: str, path: str, body: dict[str, Any] | None = None,
             timeout: float = 60) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        text = response.read()
        return response.status, json.loads(text) if text else {}
    finally:
        conn.close()


def _infer_body(x: np.ndarray) -> dict[str, Any]:
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}


def _input_name(repo: Path) -> str:
    return ort.InferenceSession(str(repo / "cnn" / "1" / "model.onnx")).get_inputs()[0].name


def test_two_replicas_answer_v2_health_and_infer_like_onnxruntime(cluster: int, repo: Path) -> None:
    serve.run(streamrt_app(repo, num_replicas=2), name="streamrt", route_prefix="/", blocking=False)
    _wait_ready(cluster)
    assert _request(cluster, "GET", "/v2/health/live")[0] == 200
    assert _request(cluster, "GET", "/v2/models/cnn/ready")[0] == 200
    session = ort.InferenceSession(str(repo / "cnn" / "1" / "model.onnx"))
    name = session.get_inputs()[0].name
    rng = np.random.default_rng(0)
    for _ in range(4):
        x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
        body = _infer_body(x)
        body["inputs"][0]["name"] = name
        status, answer = _request(cluster, "POST", "/v2/models/cnn/infer", body)
        assert status == 200, answer
        out = answer["outputs"][0]
        got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        np.testing.assert_allclose(got, session.run(None, {name: x})[0], rtol=1e-4, atol=1e-5)
    status, answer = _request(cluster, "POST", "/v2/models/nope/infer", _infer_body(np.zeros((1, 3, 32, 32), "f4")))
    assert status == 404 and "nope" in answer["error"]
    nodes = {a["node_id"] for a in _replicas()}
    assert len(nodes) == 2, "the two replicas should be spread over the two nodes (1 CPU each, 2 per node free)"


def _replicas() -> list[dict[str, Any]]:
    from ray.util.state import list_actors

    return [a for a in list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
            if a["class_name"].startswith("ServeReplica:streamrt")]


def _wait_ready(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if _request(port, "GET", "/v2/health/ready", timeout=5)[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "Ray Serve app not ready"
        time.sleep(0.2)


def test_a_replica_killed_mid_load_loses_no_request_silently(cluster: int, repo: Path) -> None:
    serve.run(streamrt_app(repo, num_replicas=2), name="streamrt", route_prefix="/", blocking=False)
    _wait_ready(cluster)
    name = _input_name(repo)
    body = _infer_body(np.ones((1, 3, 32, 32), np.float32))
    body["inputs"][0]["name"] = name
    outcomes: list[str] = []
    lock = threading.Lock()
    sent = 0
    stop = threading.Event()

    def client() -> None:
        nonlocal sent
        while not stop.is_set():
            with lock:
                sent += 1
            try:
                status, answer = _request(cluster, "POST", "/v2/models/cnn/infer", body, timeout=60)
                outcome = "ok" if status == 200 and answer["outputs"] else f"error {status}"
            except (OSError, http.client.HTTPException, ValueError) as exc:
                outcome = f"transport {type(exc).__name__}"
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    victim = _replicas()[0]
    ray.kill(ray.get_actor(victim["name"], namespace="serve"), no_restart=False)
    time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads), "a request hung"
    assert len(outcomes) == sent, f"{sent - len(outcomes)} requests lost without an answer"
    failed = [o for o in outcomes if o != "ok"]
    assert outcomes.count("ok") > 0
    assert all(o.startswith(("error 5", "transport")) for o in failed), failed  # failed clearly, never a 2xx lie
    print(f"replica killed mid-load: {sent} sent, {outcomes.count('ok')} ok, {len(failed)} failed clearly")
    _wait_ready(cluster)  # Serve replaces the replica
    assert _request(cluster, "POST", "/v2/models/cnn/infer", body)[0] == 200


def test_autoscaling_config_is_passed_through(cluster: int, repo: Path) -> None:
    app = streamrt_app(repo, num_replicas=None, autoscaling_config={"min_replicas": 2, "max_replicas": 3,
                                                                     "initial_replicas": 2})
    serve.run(app, name="streamrt", route_prefix="/", blocking=False)
    _wait_ready(cluster)
    deadline = time.monotonic() + 60
    while len(_replicas()) != 2:
        assert time.monotonic() < deadline, f"{len(_replicas())} replicas, min_replicas 2"
        time.sleep(0.5)
    deployment = serve.status().applications["streamrt"].deployments["streamrt"]
    assert deployment.status == "HEALTHY"


def test_replicas_and_autoscaling_together_are_refused(repo: Path) -> None:
    from streamrt.errors import ConfigError

    with pytest.raises(ConfigError, match="not both"):
        streamrt_app(repo, num_replicas=3, autoscaling_config={"max_replicas": 4})
