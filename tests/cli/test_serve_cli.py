"""``streamrt serve`` and ``streamrt perf``: flags map onto ServerConfig / LoadConfig; perf against a live server."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import streamrt
from streamrt.cli.main import main
from streamrt.cli.perf import parse_concurrency
from streamrt.cli.serve import JsonFormatter, config_from_args, register
from streamrt.errors import ConfigError
from streamrt.serve import ServerConfig, ServerThread
from streamrt.testing.models import CATALOGUE

pytestmark = pytest.mark.timeout(120)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_serve_flags_map_onto_server_config() -> None:
    cfg = config_from_args(_parse(["repo"]))
    assert cfg == ServerConfig().replace(startup_models=None)
    cfg = config_from_args(_parse(["repo", "--host", "0.0.0.0", "--http-port", "9000", "--grpc-port", "-1",
                                   "--model", "a", "--model", "b", "--auth-token", "t", "--no-model-control",
                                   "--max-request-bytes", "4096", "--exit-timeout", "2"]))
    assert (cfg.host, cfg.http_port, cfg.grpc_port, cfg.startup_models) == ("0.0.0.0", 9000, None, ("a", "b"))
    assert cfg.auth_token == "t" and not cfg.model_control and cfg.max_request_bytes == 4096


def test_serve_bad_repository_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a directory" in err[0]


def test_json_log_lines() -> None:
    import logging

    record = logging.LogRecord("streamrt.serve", logging.INFO, __file__, 1, "model %s ready", ("cnn",), None)
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "model cnn ready" and entry["level"] == "INFO"


def test_parse_concurrency() -> None:
    assert parse_concurrency("4") == (4,)
    assert parse_concurrency("1,8,64") == (1, 8, 64)
    assert parse_concurrency("2:8:2") == (2, 4, 6, 8)
    with pytest.raises(ConfigError):
        parse_concurrency("0")
    with pytest.raises(ConfigError):
        parse_concurrency("8:1")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("perfrepo")
    (root / "cnn" / "1").mkdir(parents=True)
    onnx.save(CATALOGUE["small_cnn"].make(), str(root / "m.onnx"))
    streamrt.build(root / "m.onnx", streamrt.BuildConfig(profiles=CATALOGUE["small_cnn"].profiles),
                   root / "cnn" / "1" / "model.plan", cache_dir=root / "cache")
    (root / "cnn" / "config.yaml").write_text("max_batch_size: 8\ndynamic_batching: {}\n")
    with ServerThread(root, ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5)) as s:
        yield s


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_against_a_live_server(live: Any, protocol: str, capsys: pytest.CaptureFixture[str],
                                    tmp_path: Path) -> None:
    port = live.http_port if protocol == "http" else live.grpc_port
    argv = ["perf", "-m", "cnn", "-u", f"127.0.0.1:{port}", "-i", protocol, "--concurrency-range", "1,4",
            "--measurement-interval", "400", "--warmup", "100", "-b", "2", "--json", "-f", str(tmp_path / "o.csv")]
    assert main(argv) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["concurrency"] for r in results] == [1, 4]
    assert all(r["requests"] > 0 and r["errors"] == 0 and r["throughput"] > 0 for r in results)
    assert results[1]["server_us"]["compute_infer"] > 0 and results[1]["latency_ms"]["p99"] > 0
    assert (tmp_path / "o.csv").read_text().startswith("Concurrency,Inferences/Second")


def test_perf_unknown_model_is_one_line(live: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["perf", "-m", "nope", "-u", f"127.0.0.1:{live.http_port}", "--measurement-interval", "100"]) == 2
    assert "nope" in capsys.readouterr().err


def test_in_process_matches_engine(live: Any) -> None:
    from streamrt.serve.wire.protocol import InferRequest

    x = np.random.default_rng().standard_normal((3, 3, 32, 32)).astype(np.float32)
    response = live.call(live.server.infer(InferRequest("cnn", inputs={"x": x})), timeout=30)
    assert response.outputs["logits"].shape == (3, 10)
