"""The KServe manifests of deploy/kserve/ and deploy/Dockerfile against the real server.

Every manifest parses and has the kinds and fields KServe needs; the runtime's container arguments
go through the real ``streamrt`` CLI parser; a real ``streamrt serve`` started with those arguments
and environment (host and ports moved to free loopback ones) answers the probe paths, the metrics
port and the bearer token the runtime's env passes.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamrt.cli.main import _parser
from streamrt.cli.serve import config_from_args
from streamrt.testing.models import CATALOGUE

pytest.importorskip("aiohttp")

ROOT = Path(__file__).resolve().parents[2]
KSERVE = ROOT / "deploy" / "kserve"
SERVER_ENV = {"STREAMRT_SERVE_TOKEN"}  # every environment variable `streamrt serve` reads
TOKEN = "kserve-test-token"


def _documents() -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(KSERVE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[doc["kind"]] = doc
    return docs


@pytest.fixture(scope="module")
def docs() -> dict[str, dict[str, Any]]:
    return _documents()


def _container(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    containers = docs["ServingRuntime"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_manifests_have_the_kinds_and_fields_kserve_needs(docs: dict[str, dict[str, Any]]) -> None:
    runtime, service = docs["ServingRuntime"], docs["InferenceService"]
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert {"onnx", "streamrt"} <= formats
    assert "v2" in runtime["spec"]["protocolVersions"]
    container = _container(docs)
    assert container["name"] == "kserve-container"
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in formats
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert re.match(r"^(s3|gs|https?|pvc)://", model["storageUri"])
    predictor = service["spec"]["predictor"]
    assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]


def test_probes_and_scrape_annotations_point_at_the_server_ports(docs: dict[str, dict[str, Any]]) -> None:
    container = _container(docs)
    args = container["args"]
    http_port = int(_flag(args, "--http-port"))
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": http_port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": http_port}
    assert [p["containerPort"] for p in container["ports"]] == [http_port]
    notes = docs["ServingRuntime"]["spec"]["annotations"]
    metrics_port = _flag(args, "--metrics-port")
    assert notes["prometheus.kserve.io/port"] == notes["prometheus.io/port"] == metrics_port
    assert notes["prometheus.kserve.io/path"] == notes["prometheus.io/path"] == "/metrics"
    assert docs["InferenceService"]["metadata"]["annotations"]["serving.kserve.io/enable-prometheus-scraping"] \
        == "true"


def test_the_cli_parser_takes_the_container_args(docs: dict[str, dict[str, Any]]) -> None:
    args = _container(docs)["args"]
    parsed = _parser().parse_args(args)
    assert parsed.command == "serve" and parsed.repository == Path("/mnt/models")
    config = config_from_args(parsed)
    assert (config.host, config.http_port, config.grpc_port, config.metrics_port) == ("0.0.0.0", 8080, 9000, 8002)
    assert config.exit_timeout_s == 25.0 and parsed.log_format == "json"


def test_the_dockerfile_default_command_parses_like_the_runtime(docs: dict[str, dict[str, Any]]) -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    entry = yaml.safe_load(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))  # type: ignore[union-attr]
    cmd = yaml.safe_load(re.search(r"^CMD (.+)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert entry == ["streamrt"]
    image = config_from_args(_parser().parse_args(cmd))
    runtime = config_from_args(_parser().parse_args(_container(docs)["args"]))
    assert (image.http_port, image.grpc_port, image.metrics_port) == \
        (runtime.http_port, runtime.grpc_port, runtime.metrics_port)
    assert "torch==2.13.0" in text and "whl/cpu" in text  # the CPU wheel pinned, as the README says


def test_every_env_var_the_runtime_passes_is_one_the_server_reads(docs: dict[str, dict[str, Any]]) -> None:
    names = {e["name"] for e in _container(docs).get("env", [])}
    assert names <= SERVER_ENV, f"the server does not read {sorted(names - SERVER_ENV)}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _local_args(args: list[str], repo: Path) -> list[str]:
    """The container args with /mnt/models, the host and the ports moved to this machine's loopback."""
    out = [str(repo) if a == "/mnt/models" else a for a in args]
    out[out.index("--host") + 1] = "127.0.0.1"
    for flag in ("--http-port", "--grpc-port", "--metrics-port"):
        out[out.index(flag) + 1] = str(_free_port())
    return out


@pytest.fixture(scope="module")
def served(docs: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    repo = tmp_path_factory.mktemp("mnt-models")
    (repo / "cnn" / "1").mkdir(parents=True)
    import onnx

    onnx.save(CATALOGUE["small_cnn"].make(), str(repo / "cnn" / "1" / "model.onnx"))
    args = _local_args(_container(docs)["args"], repo)
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))  # keep carried packages
    env = {**os.environ, "PYTHONPATH": path, "STREAMRT_SERVE_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "streamrt.cli.main", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        port = int(_flag(args, "--http-port"))
        deadline = time.monotonic() + 120
        while _get(port, "/v2/health/ready")[0] != 200:
            assert proc.poll() is None, f"streamrt serve exited: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "streamrt serve not ready after 120 s"
            time.sleep(0.1)
        yield args
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read().decode()
    except OSError:
        return -1, ""
    finally:
        conn.close()


def test_the_served_runtime_answers_the_probes_and_metrics(served: list[str]) -> None:
    http_port, metrics_port = int(_flag(served, "--http-port")), int(_flag(served, "--metrics-port"))
    assert _get(http_port, "/v2/health/live")[0] == 200
    assert _get(http_port, "/v2/health/ready")[0] == 200
    status, text = _get(metrics_port, "/metrics")
    assert status == 200 and "nv_model_load_duration_secs" in text


def test_the_served_runtime_honours_the_token_from_its_env(served: list[str]) -> None:
    http_port = int(_flag(served, "--http-port"))
    assert _get(http_port, "/v2/models/cnn")[0] == 401
    status, text = _get(http_port, "/v2/models/cnn", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and '"name":"cnn"' in text.replace(" ", "")
