"""``streamrt perf`` against a live server when something is wrong (issue 29): one line that says
what, never a cut-off ``AioRpcError`` block, a table of ``nan`` or a CSV of zeros; and the server
logs a gRPC client at its HTTP port as one warning line, not a traceback."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import onnx
import pytest

import streamrt
from helpers import wait_until
from streamrt.cli.main import main
from streamrt.serve import ServerConfig, ServerThread
from streamrt.testing.models import CATALOGUE

pytestmark = pytest.mark.timeout(120)
FAST = ["--measurement-interval", "300", "--warmup-ms", "50"]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("perf-errors")
    (root / "cnn" / "1").mkdir(parents=True)
    onnx.save(CATALOGUE["small_cnn"].make(), str(root / "m.onnx"))
    streamrt.build(root / "m.onnx", streamrt.BuildConfig(profiles=CATALOGUE["small_cnn"].profiles),
                   root / "cnn" / "1" / "model.plan", cache_dir=tmp_path_factory.mktemp("perf-cache"))
    (root / "cnn" / "config.yaml").write_text("max_batch_size: 8\ndynamic_batching: {}\n")
    with ServerThread(root, ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5)) as s:
        yield s


def _line(status: int, capsys: pytest.CaptureFixture[str]) -> str:
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err) and "AioRpcError" not in "\n".join(err), err
    return err[-1]


def test_grpc_at_the_http_port_is_one_line_and_the_server_warns_once(
        live: Any, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    url = f"127.0.0.1:{live.http_port}"
    with caplog.at_level(logging.WARNING, logger="aiohttp.server"):
        line = _line(main(["perf", "-m", "cnn", "-u", url, "-i", "grpc", *FAST]), capsys)
        wait_until(lambda: any(r.name == "aiohttp.server" for r in caplog.records), "the server's log line", 10)
    assert line.startswith(f"streamrt perf: error: no gRPC server at {url} (an HTTP server answered?)"), line
    served = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert served, "the server logged nothing about the malformed request"
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in served), served
    assert "malformed HTTP request" in served[0].getMessage() and "\n" not in served[0].getMessage()


def test_grpc_with_no_server_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = _line(main(["perf", "-m", "cnn", "-u", f"127.0.0.1:{port}", "-i", "grpc", *FAST]), capsys)
    assert line.startswith(f"streamrt perf: error: no gRPC server at 127.0.0.1:{port}"), line


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_batch_over_the_max_fails_with_the_servers_first_error(live: Any, protocol: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    port = live.http_port if protocol == "http" else live.grpc_port
    csv = tmp_path / "x.csv"
    line = _line(main(["perf", "-m", "cnn", "-u", f"127.0.0.1:{port}", "-i", protocol, "-b", "64", *FAST,
                       "-o", str(csv)]), capsys)
    assert "the server refused every request at concurrency 1" in line
    assert "batch size 64" in line and "max_batch_size" in line and "nan" not in line
    assert not csv.exists()  # no CSV of zeros


def test_perf_output_folders_are_created_as_build_does(live: Any, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "nodir" / "deeper" / "x.csv"
    assert main(["perf", "-m", "cnn", "-u", f"127.0.0.1:{live.http_port}", "-b", "2", *FAST, "-o", str(csv)]) == 0
    assert csv.read_text().startswith("Concurrency,Inferences/Second")
    capsys.readouterr()
