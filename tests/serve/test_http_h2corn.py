"""HTTP served by h2corn (``--http-server h2corn``): the tritonclient HTTP tests of test_tritonclient.py against it
(test_triton_repo.py runs its Triton examples on it too, in one process and through two front-end processes), the
listener's own answers on the wire (errors, compression, forwarded routes, keep-alive) and the configuration errors."""

from __future__ import annotations

import gzip
import json
import sys
import zlib
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("h2corn")
pytest.importorskip("tritonclient.http")

import tritonclient.http as thttp
from tests.serve.conftest import BEHAVIOURS, fake_loader, make_repo, server_config
from tests.serve.test_tritonclient import (  # noqa: F401  (re-run here, against h2corn)
    grpc,
    http,
    test_errors_reach_the_client,
    test_failed_load_is_unavailable_with_reason,
    test_health_and_metadata_http,
    test_http_async_infer_and_output_subset,
    test_http_infer_defaults_version_and_two_inputs,
    test_http_infer_matches_engine,
    test_load_with_config_override,
    test_repository_index_load_unload,
    test_statistics_http_and_grpc,
)

from streamrt.errors import ConfigError
from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.listeners.http_h2corn import infer_route
from streamrt.serve.server import ServerThread

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, plans: dict[str, Path]) -> Iterator[ServerThread]:
    repo = make_repo(tmp_path_factory.mktemp("repo"), plans)
    with ServerThread(repo, server_config(http_server="h2corn"), engine_loader=fake_loader,
                      start_timeout=120) as running:
        yield running
    for b in BEHAVIOURS.values():
        b.reset()


def _binary_body(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def _logits(data: bytes, header_length: int) -> np.ndarray:
    return np.frombuffer(data[header_length:], np.float32).reshape(-1, 10)


def _x(n: int) -> np.ndarray:
    return np.random.default_rng().standard_normal((n, 3, 32, 32)).astype(np.float32)


def test_infer_route_matches_what_aiohttp_routes_to_infer() -> None:
    assert infer_route("POST", "/v2/models/cnn/infer") == ("cnn", "")
    assert infer_route("POST", "/v2/models/cnn/versions/2/infer") == ("cnn", "2")
    for method, path in (("GET", "/v2/models/cnn/infer"), ("POST", "/v2/models//infer"),
                         ("POST", "/v2/models/cnn/versions//infer"), ("POST", "/v2/models/a/b/infer"),
                         ("POST", "/v2/models/cnn/ready"), ("POST", "/v2/models/infer")):
        assert infer_route(method, path) is None, (method, path)


def test_wire_answers_on_one_kept_alive_connection(server: ServerThread, reference: Any) -> None:
    """Binary and compressed requests, compressed replies and forwarded routes, all on one HTTP/1.1
    connection (keep-alive)."""
    connection = HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        def post(path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
            connection.request("POST", path, body=body, headers=headers)
            reply = connection.getresponse()
            return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()

        x = _x(2)
        expected = reference("small_cnn", {"x": x})["logits"]
        body, headers = _binary_body(x)
        for coding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body)), ("", body)):
            sent = {**headers, **({"Content-Encoding": coding} if coding else {})}
            status, got, data = post("/v2/models/cnn/versions/1/infer", packed, sent)
            assert status == 200 and got["content-type"] == "application/octet-stream", data[:200]
            np.testing.assert_allclose(_logits(data, int(got["inference-header-content-length"])), expected,
                                       rtol=1e-4, atol=1e-5)
        big = _x(8)  # 320 B of logits + the header: under 1 KiB stays identity; JSON output is over it
        json_body = json.dumps({"inputs": [{"name": "x", "shape": list(big.shape), "datatype": "FP32",
                                            "data": big.reshape(-1).tolist()}]}).encode()
        for accept, decode in (("gzip", gzip.decompress), ("deflate", zlib.decompress)):
            status, got, data = post("/v2/models/cnn/infer", json_body, {"Accept-Encoding": accept})
            assert status == 200 and got["content-encoding"] == accept and got["content-type"] == "application/json"
            logits = json.loads(decode(data))["outputs"][0]["data"]
            np.testing.assert_allclose(np.reshape(logits, (8, 10)), reference("small_cnn", {"x": big})["logits"],
                                       rtol=1e-4, atol=1e-5)
        connection.request("GET", "/v2/health/ready")
        reply = connection.getresponse()
        assert reply.status == 200 and reply.read() == b""
        connection.request("GET", "/v2/models/cnn")
        reply = connection.getresponse()
        assert reply.status == 200 and json.loads(reply.read())["name"] == "cnn"
        connection.request("GET", "/v2/models/cnn/infer")  # aiohttp's answer to the wrong method
        reply = connection.getresponse()
        assert reply.status == 405 and "error" in json.loads(reply.read())
        connection.request("GET", "/v2/trace/setting")
        reply = connection.getresponse()
        assert reply.status == 501 and "trace" in json.loads(reply.read())["error"]
    finally:
        connection.close()


@pytest.fixture(scope="module")
def aiohttp_server(tmp_path_factory: pytest.TempPathFactory, plans: dict[str, Path]) -> Iterator[ServerThread]:
    repo = make_repo(tmp_path_factory.mktemp("repo"), plans)
    with ServerThread(repo, server_config(grpc_port=None, metrics_port=None), engine_loader=fake_loader,
                      start_timeout=120) as running:
        yield running


def _answer(port: int, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[Any, ...]:
    connection = HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers)
        reply = connection.getresponse()
        data = reply.read()
        return reply.status, reply.getheader("Content-Type"), json.loads(data) if data else None
    finally:
        connection.close()


def test_refusals_answer_what_aiohttp_answers(server: ServerThread, aiohttp_server: ServerThread) -> None:
    """Each bad request gets the same status, content type and ``{"error": ...}`` from both listeners."""
    body, headers = _binary_body(_x(1))
    cases = [
        ("POST", "/v2/models/nope/infer", body, headers, 404),  # Triton's status for an unknown model
        ("POST", "/v2/models/cnn/versions/9/infer", body, headers, 404),
        ("POST", "/v2/models/cnn/infer", b"{not json", {}, 400),
        ("POST", "/v2/models/cnn/infer", b"[1, 2]", {}, 400),
        ("POST", "/v2/models/cnn/infer", body, {"Inference-Header-Content-Length": "x"}, 400),
        ("POST", "/v2/models/cnn/infer", body, {"Inference-Header-Content-Length": "99999"}, 400),
        ("POST", "/v2/models/cnn/infer", body, {**headers, "Content-Encoding": "compress"}, 501),
        ("POST", "/v2/models/cnn/infer", json.dumps({"inputs": [{"name": "x", "shape": [1, 5], "datatype": "FP32",
                                                                 "data": [1, 2, 3, 4, 5]}]}).encode(), {}, 400),
        ("GET", "/v2/models/cnn/infer", None, {}, 405),
        ("GET", "/v2/models/nope", None, {}, 404),
        ("GET", "/v2/trace/setting", None, {}, 501),
    ]
    for method, path, sent, sent_headers, status in cases:
        ours = _answer(server.http_port, method, path, sent, sent_headers)
        theirs = _answer(aiohttp_server.http_port, method, path, sent, sent_headers)
        assert ours == theirs and ours[0] == status and "error" in ours[2], (method, path, ours, theirs)
    for port in (server.http_port, aiohttp_server.http_port):  # the words differ (each names its decoder's error)
        garbage = _answer(port, "POST", "/v2/models/cnn/infer", b"\x1f\x8b junk", {"Content-Encoding": "gzip"})
        assert garbage[0] == 400 and "decode" in garbage[2]["error"], garbage


def test_the_body_limit_and_the_token(tmp_path: Path, plans: dict[str, Path]) -> None:
    config = server_config(http_server="h2corn", grpc_port=None, metrics_port=None, max_request_bytes=4096,
                           auth_token="s3cret")
    with ServerThread(make_repo(tmp_path / "repo", plans), config, engine_loader=fake_loader,
                      start_timeout=120) as running:
        body, headers = _binary_body(_x(1))  # 12 KiB of tensor
        client = thttp.InferenceServerClient(f"127.0.0.1:{running.http_port}")
        try:
            assert client.is_server_live()  # health needs no token (forwarded)
            connection = HTTPConnection("127.0.0.1", running.http_port, timeout=30)
            connection.request("POST", "/v2/models/cnn/infer", body=body, headers=headers)
            reply = connection.getresponse()
            assert reply.status == 401 and "bearer token" in json.loads(reply.read())["error"]
            connection.request("POST", "/v2/models/cnn/infer", body=body,
                               headers={**headers, "Authorization": "Bearer s3cret"})
            reply = connection.getresponse()
            assert reply.status == 413 and "exceeds the limit of 4096" in json.loads(reply.read())["error"]
            connection.request("POST", "/v2/models/cnn/infer", body=gzip.compress(body),
                               headers={**headers, "Authorization": "Bearer s3cret", "Content-Encoding": "gzip"})
            reply = connection.getresponse()
            assert reply.status == 413 and "limit of 4096" in json.loads(reply.read())["error"]
            connection.close()
        finally:
            client.close()


def test_missing_h2corn_is_one_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="unknown HTTP server 'tornado'"):
        ServerConfig(http_server="tornado")
    monkeypatch.setitem(sys.modules, "h2corn", None)  # find_spec: not installed
    with pytest.raises(ConfigError, match="--http-server h2corn needs the h2corn package") as err:
        ServerConfig(http_server="h2corn")
    assert "pip install 'streamrt[fast-grpc]'" in str(err.value)
