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
from tests.serve.conftest import fake_loader, make_repo, server_config, serving
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
    yield from serving(tmp_path_factory, plans, http_server="h2corn", grpc_server="h2corn")  # one Tokio runtime


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
            # a forwarded route over the limit: the same 413 JSON answer (refused by the listener before it is held
            # whole and sent on; the aiohttp app behind would answer alike, so this checks the answer, not where)
            connection.request("POST", "/v2/repository/models/cnn/load", body=b"{" + b" " * 8192 + b"}",
                               headers={"Authorization": "Bearer s3cret", "Content-Type": "application/json"})
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


def test_the_flag_and_the_missing_package_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``--http-server h2corn`` reaches ServerConfig; without h2corn ``streamrt serve`` prints one line with the pip
    command and exits 2, as ``--grpc-server h2corn`` does."""
    import argparse

    from streamrt.cli.main import main
    from streamrt.cli.serve import config_from_args, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert config_from_args(parser.parse_args(["serve", "repo", "--http-server", "h2corn"])).http_server == "h2corn"
    assert config_from_args(parser.parse_args(["serve", "repo"])).http_server == "aiohttp"
    (tmp_path / "repo").mkdir()
    monkeypatch.setitem(sys.modules, "h2corn", None)
    for flag in ("--http-server", "--grpc-server"):
        assert main(["serve", str(tmp_path / "repo"), flag, "h2corn"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{flag} h2corn needs the h2corn package" in err[0] \
            and "pip install 'streamrt[fast-grpc]'" in err[0], err


class _Forwarded:
    """An HttpForwarder that records what it was asked and answers 299."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[tuple[str, str]], bytes]] = []

    async def forward(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> Any:
        self.calls.append((method, target, list(headers), body))
        return 299, {"Content-Type": "text/plain"}, target.encode()


def _call(app: Any, method: str, path: str, headers: dict[str, str], pieces: list[bytes],
          query: bytes = b"") -> tuple[int, dict[bytes, bytes], bytes]:
    """One request through the ASGI app, its body in ``pieces`` (as h2corn hands over 8 KiB at a time)."""
    import asyncio

    events = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return events.pop(0) if events else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": query,
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def test_the_asgi_app_reads_into_the_ports_buffer_and_forwards_the_rest() -> None:
    """Over test_port.py's DoublingPort: the body, split in pieces, lands in the port's buffer (the request's
    tensor is a view of it), a refused request gives its buffer back, and any other route is forwarded whole
    with its query and still-encoded body."""
    from tests.serve.test_port import AUTH, DoublingPort, _binary_body, _binary_output

    from streamrt.serve.listeners.http_h2corn import HttpAsgi

    port, forwarder = DoublingPort(), _Forwarded()
    app = HttpAsgi(port, forwarder)  # type: ignore[arg-type]
    x = np.random.default_rng().standard_normal((2, 700)).astype(np.float32)
    body, headers = _binary_body(x)
    pieces = [body[i : i + 1000] for i in range(0, len(body), 1000)]
    sized = {**headers, "Content-Length": str(len(body))}
    status, _, data = _call(app, "POST", "/v2/models/m/infer", sized, pieces)
    assert status == 401 and port.buffers == []  # refused before any body was read
    status, got, data = _call(app, "POST", "/v2/models/m/versions/3/infer", {**sized, **AUTH}, pieces)
    assert status == 200 and b"content-encoding" not in got  # no Accept-Encoding: identity
    np.testing.assert_array_equal(_binary_output(data, int(got[b"inference-header-content-length"])), 2 * x)
    request, buffer = port.answered[-1]
    assert (request.model, request.version) == ("m", "3") and buffer is port.buffers[0]
    assert np.shares_memory(request.inputs["x"], buffer.array) and port.released == []
    status, got, data = _call(app, "POST", "/v2/models/m/infer", {**AUTH, "Content-Length": "9"}, [b"{not json"])
    assert status == 400 and "malformed JSON" in json.loads(data)["error"] and port.released == [1]
    status, got, data = _call(app, "POST", "/v2/models/m/infer", {**sized, **AUTH}, pieces[:-1])
    assert status == 400 and "ended after" in json.loads(data)["error"] and port.released == [1, 2]
    packed = gzip.compress(body)
    status, got, data = _call(app, "POST", "/v2/models/m/infer", {**headers, **AUTH, "Content-Encoding": "gzip"},
                              [packed[:100], packed[100:]])
    assert status == 200 and port.answered[-1][1] is None  # decoded in memory of its own, not the port's buffer
    assert forwarder.calls == []
    status, got, data = _call(app, "POST", "/v2/repository/index", {"Content-Encoding": "gzip"},
                              [packed[:10], packed[10:]], query=b"a=1")
    assert status == 299 and data == b"/v2/repository/index?a=1"
    method, _, sent, forwarded = forwarder.calls[-1]
    assert method == "POST" and forwarded == packed and ("content-encoding", "gzip") in sent
