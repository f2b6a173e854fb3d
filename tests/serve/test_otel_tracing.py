"""OpenTelemetry tracing: a server with ``trace_otlp_url`` sends its traced requests as spans over
OTLP/HTTP to a real receiver here (an HTTP server decoding the official ``ExportTraceServiceRequest``
protobuf): the span tree of a plain and an ensemble request, a caller's W3C traceparent joined,
a failed request marked ERROR, and nothing lost at shutdown."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
pytest.importorskip("tritonclient.http")

import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from tests.serve.conftest import fake_loader, make_repo, server_config
from tritonclient.utils import InferenceServerException

from streamrt.errors import ConfigError
from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.observability.otel import parse_traceparent
from streamrt.serve.server import ServerThread

pytestmark = pytest.mark.timeout(120)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Receiver:
    """An OTLP/HTTP traces endpoint: every span it is sent, decoded with the official protobuf."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[dict[str, str]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                message = ExportTraceServiceRequest.FromString(body)
                for resource_spans in message.resource_spans:
                    receiver.resources.append({a.key: a.value.string_value
                                               for a in resource_spans.resource.attributes})
                    for scope in resource_spans.scope_spans:
                        receiver.spans.extend(scope.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _attrs(span: Any) -> dict[str, str]:
    return {a.key: a.value.string_value for a in span.attributes}


def _children(spans: list[Any], parent: Any) -> dict[str, Any]:
    return {s.name: s for s in spans if s.parent_span_id == parent.span_id and s.trace_id == parent.trace_id}


def _within(child: Any, parent: Any) -> bool:
    return parent.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano \
        <= parent.end_time_unix_nano


def test_spans_of_plain_ensemble_and_failed_requests(tmp_path: Path, plans: dict[str, Path],
                                                      receiver: Receiver) -> None:
    repo = make_repo(tmp_path / "repo", plans)
    (repo / "wrapped" / "1").mkdir(parents=True)
    (repo / "wrapped" / "config.yaml").write_text(yaml.safe_dump({
        "platform": "ensemble", "max_batch_size": 8,
        "input": [{"name": "IMAGE", "data_type": "TYPE_FP32", "dims": [3, 32, 32]}],
        "output": [{"name": "LOGITS", "data_type": "TYPE_FP32", "dims": [10]}],
        "ensemble_scheduling": {"step": [{"model_name": "cnn", "model_version": -1, "input_map": {"x": "IMAGE"},
                                          "output_map": {"logits": "LOGITS"}}]}}))
    config = server_config(trace_otlp_url=receiver.url, startup_models=("cnn", "wrapped"))
    x = np.random.default_rng(5).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with ServerThread(repo, config, engine_loader=fake_loader, start_timeout=120) as server:
        http = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        tensor = thttp.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        http.infer("cnn", [tensor], request_id="joined", headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
        g_tensor = tgrpc.InferInput("x", list(x.shape), "FP32")
        g_tensor.set_data_from_numpy(x)
        grpc.infer("cnn", [g_tensor], request_id="fresh")
        e_tensor = thttp.InferInput("IMAGE", list(x.shape), "FP32")
        e_tensor.set_data_from_numpy(x)
        http.infer("wrapped", [e_tensor], request_id="ensemble")
        bad = thttp.InferInput("x", [2, 3, 31, 32], "FP32")
        bad.set_data_from_numpy(x[:, :, :31])
        with pytest.raises(InferenceServerException):
            http.infer("cnn", [bad], request_id="refused")
    # The server stopped: its tracer flushed every span to the receiver before returning.
    roots = {_attrs(s)["request.id"]: s for s in receiver.spans if s.name.startswith("infer ")}
    assert set(roots) >= {"joined", "fresh", "ensemble", "refused"}, sorted(roots)
    assert receiver.resources[0]["service.name"] == "streamrt"

    joined = roots["joined"]
    assert joined.trace_id.hex() == TRACE_ID and joined.parent_span_id.hex() == PARENT_ID
    assert joined.name == "infer cnn" and joined.kind == joined.SPAN_KIND_SERVER
    assert _attrs(joined) == {"model.name": "cnn", "model.version": "1", "request.id": "joined"}
    parts = _children(receiver.spans, joined)
    assert set(parts) == {"queue", "compute"}
    assert all(_within(p, joined) for p in parts.values())
    assert parts["queue"].end_time_unix_nano <= parts["compute"].start_time_unix_nano + 1
    compute = _children(receiver.spans, parts["compute"])
    assert set(compute) == {"compute_input", "compute_infer", "compute_output"}
    assert all(_within(c, parts["compute"]) for c in compute.values())

    fresh = roots["fresh"]
    assert fresh.trace_id.hex() != TRACE_ID and not fresh.parent_span_id  # no traceparent: a trace of its own

    ensemble = roots["ensemble"]
    steps = _children(receiver.spans, ensemble)
    assert set(steps) == {"step 0"} and _within(steps["step 0"], ensemble)
    assert set(_children(receiver.spans, steps["step 0"])) == {"queue", "compute"}

    refused = roots["refused"]
    assert refused.status.code == refused.status.STATUS_CODE_ERROR and "shape" in refused.status.message


def test_traceparent_parsing_and_bad_urls() -> None:
    assert parse_traceparent(f"00-{TRACE_ID}-{PARENT_ID}-01") == (int(TRACE_ID, 16), int(PARENT_ID, 16), 1)
    for bad in (None, "", "garbage", f"00-{'0' * 32}-{PARENT_ID}-01", f"00-{TRACE_ID}-{'0' * 16}-01",
                f"01-{TRACE_ID}-{PARENT_ID}-01x"):
        assert parse_traceparent(bad) is None  # W3C: a bad header starts a new trace
    with pytest.raises(ConfigError, match="trace_otlp_url must be an http"):
        ServerConfig(trace_otlp_url="localhost:4318")


@pytest.mark.parametrize("frontend_processes", [1, 2], ids=["one-process", "2-frontend-processes"])
def test_traceparent_through_front_end_workers(tmp_path: Path, plans: dict[str, Path], receiver: Receiver,
                                               frontend_processes: int) -> None:
    """The header is read by the listeners over HTTP and gRPC: in the one process, and with
    --frontend-processes 2 in a worker, from where it crosses the channel."""
    repo = make_repo(tmp_path / "repo", plans)
    config = server_config(trace_otlp_url=receiver.url, startup_models=("cnn",),
                           frontend_processes=frontend_processes)
    x = np.random.default_rng(6).standard_normal((1, 3, 32, 32)).astype(np.float32)
    with ServerThread(repo, config, engine_loader=fake_loader, start_timeout=120) as server:
        for protocol, port in (("http", server.http_port), ("grpc", server.grpc_port)):
            module: Any = thttp if protocol == "http" else tgrpc
            client = module.InferenceServerClient(f"127.0.0.1:{port}")
            tensor = module.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            client.infer("cnn", [tensor], request_id=protocol, headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    roots = {_attrs(s)["request.id"]: s for s in receiver.spans if s.name.startswith("infer ")}
    for protocol in ("http", "grpc"):
        assert roots[protocol].trace_id.hex() == TRACE_ID and roots[protocol].parent_span_id.hex() == PARENT_ID
