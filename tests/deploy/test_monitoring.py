"""deploy/monitoring against a real server: every series the Grafana dashboard and the Prometheus
alert rules use must exist in ``/metrics`` after load (a renamed metric breaks this test, not an
operator's dashboard). Also: the histograms agree with the statistics API."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml

from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.server import ServerThread
from streamrt.testing.models import CATALOGUE

parser = pytest.importorskip("prometheus_client.parser")
httpclient = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
METRIC_NAME = re.compile(r"\b(?:nv|streamrt)_[a-zA-Z0-9_:]+\b")
GPU_ONLY = re.compile(r"^nv_(gpu|energy)_")
"""Series NVML provides: declared everywhere, with samples only where a GPU and nvidia-ml-py are."""


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def alert_expressions() -> list[str]:
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def metric_names(expressions: list[str]) -> set[str]:
    """Metric names in PromQL expressions (StreamRT's and Triton's prefixes)."""
    return {name for expr in expressions for name in METRIC_NAME.findall(expr)}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    repo = tmp_path_factory.mktemp("repo")
    folder = repo / "cnn" / "1"
    folder.mkdir(parents=True)
    onnx.save(CATALOGUE["small_cnn"].make(), str(folder / "model.onnx"))
    (repo / "cnn" / "config.yaml").write_text(yaml.safe_dump({
        "max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 2000}
    }))
    mp = pytest.MonkeyPatch()
    mp.setenv("STREAMRT_CACHE", str(tmp_path_factory.mktemp("cache")))
    config = ServerConfig(http_port=0, grpc_port=None, metrics_port=0, exit_timeout_s=5.0)
    try:
        with ServerThread(repo, config, start_timeout=120) as running:
            yield running
    finally:
        mp.undo()


def drive_load(port: int, requests: int = 24) -> None:
    """Concurrent successful requests (so batches form) and a few that fail validation."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", concurrency=8)
    rng = np.random.default_rng(0)
    pending = []
    for _ in range(requests):
        x = rng.standard_normal((1, 3, 32, 32), dtype=np.float32)
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        pending.append(client.async_infer("cnn", [inp]))
    for p in pending:
        p.get_result()
    for _ in range(3):
        bad = httpclient.InferInput("x", [1, 3, 31, 32], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3, 31, 32), np.float32))
        with pytest.raises(InferenceServerException, match=r"shape|dimension"):
            client.infer("cnn", [bad])
    client.close()


def scrape(port: int) -> dict[str, Any]:
    """Family name -> family, parsed by prometheus_client's own text parser."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {family.name: family for family in parser.text_string_to_metric_families(text)}


def exposed_names(family: Any, sample_name: str) -> set[str]:
    """The series name as written in /metrics: the parser adds ``_total`` to counter samples,
    which Triton's names (and so ours) do not have."""
    return {sample_name, family.name} if family.type == "counter" else {sample_name}


def test_the_files_parse_and_name_metrics() -> None:
    assert len(dashboard_expressions()) >= 10 and len(alert_expressions()) == 5
    assert {"streamrt_request_duration_us_bucket", "nv_inference_pending_request_count",
            "nv_gpu_memory_used_bytes"} <= metric_names(dashboard_expressions() + alert_expressions())


def test_every_series_of_the_dashboard_and_alerts_exists(server: ServerThread) -> None:
    drive_load(server.http_port)
    families = scrape(server.metrics_port)
    present = {series for f in families.values() for s in f.samples if s.labels.get("model") == "cnn"
               for series in exposed_names(f, s.name)}
    wanted = metric_names(dashboard_expressions() + alert_expressions())
    missing = sorted(n for n in wanted if n not in present and not (GPU_ONLY.match(n) and n in families))
    assert not missing, f"series used by deploy/monitoring but absent from /metrics: {missing}"


def test_histograms_agree_with_the_statistics_api(server: ServerThread) -> None:
    drive_load(server.http_port, requests=8)
    families = scrape(server.metrics_port)
    stats = server.statistics("cnn")["model_stats"][0]

    def value(family: str, suffix: str, **labels: str) -> float:
        found = [s.value for s in families[family].samples
                 if s.name == family + suffix and s.labels.get("model") == "cnn"
                 and all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) == 1, (family, suffix, labels)
        return float(found[0])

    inference = stats["inference_stats"]
    requests = inference["success"]["count"] + inference["fail"]["count"]
    assert value("streamrt_request_duration_us", "_count") == requests
    assert value("streamrt_request_duration_us", "_bucket", le="+Inf") == requests
    assert value("streamrt_queue_duration_us", "_count") == inference["queue"]["count"]
    assert value("streamrt_batch_size", "_count") == stats["execution_count"]
    assert value("streamrt_batch_size", "_sum") == stats["inference_count"]
    assert value("streamrt_compute_duration_us", "_count") == stats["execution_count"]
    buckets = [s for s in families["streamrt_batch_size"].samples
               if s.name.endswith("_bucket") and s.labels.get("model") == "cnn"]
    counts = [s.value for s in buckets]
    assert counts == sorted(counts), "cumulative buckets must not decrease"
    assert value("streamrt_batch_size", "_bucket", le="1") < stats["execution_count"] or max(
        b["batch_size"] for b in stats["batch_stats"]) == 1
    assert value("streamrt_model_ready", "", version="1") == 1
    assert value("nv_inference_pending_request_count", "") == 0


@pytest.mark.gpu
def test_gpu_series_have_samples_through_nvml(server: ServerThread) -> None:
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    families = scrape(server.metrics_port)

    def values(name: str) -> dict[str, float]:
        return {s.labels["gpu_uuid"]: s.value for s in families[name].samples}

    total, used = values("nv_gpu_memory_total_bytes"), values("nv_gpu_memory_used_bytes")
    assert total and set(total) == set(used), "NVML sees a GPU, so every GPU series needs a sample"
    assert all(0 < used[g] <= total[g] for g in total)
    assert all(0 <= u <= 1 for u in values("nv_gpu_utilization").values())
    assert all(0 < p <= values("nv_gpu_power_limit")[g] * 1.5 for g, p in values("nv_gpu_power_usage").items())
