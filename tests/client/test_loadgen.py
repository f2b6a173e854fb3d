"""The load generator beyond one process: ``--processes`` merges several client processes into one
report, ``--shared-memory system`` drives the server through registered regions (and leaves none
behind), and the client-limit warning fires only for a busy client."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import onnx
import pytest

import streamrt
from streamrt.cli.main import main
from streamrt.client.loadgen import CLIENT_BUSY_WARNING, LoadConfig, _close, _merge, _open, _Part
from streamrt.serve import ServerConfig, ServerThread
from streamrt.testing.models import CATALOGUE

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("loadgen")
    (root / "cnn" / "1").mkdir(parents=True)
    onnx.save(CATALOGUE["small_cnn"].make(), str(root / "m.onnx"))
    streamrt.build(root / "m.onnx", streamrt.BuildConfig(profiles=CATALOGUE["small_cnn"].profiles),
                   root / "cnn" / "1" / "model.plan", cache_dir=root / "cache")
    (root / "cnn" / "config.yaml").write_text("max_batch_size: 8\ndynamic_batching: {}\n")
    with ServerThread(root, ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5)) as s:
        yield s


def _perf(live: Any, protocol: str, *extra: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    port = live.http_port if protocol == "http" else live.grpc_port
    argv = ["perf", "-m", "cnn", "-u", f"127.0.0.1:{port}", "-i", protocol, "--concurrency-range", "4",
            "--measurement-interval", "800", "--warmup", "200", "-b", "2", "--json", *extra]
    assert main(argv) == 0
    return dict(json.loads(capsys.readouterr().out)[0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_processes_merge_into_one_report(live: Any, protocol: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = live.statistics("cnn")["model_stats"][0]["inference_stats"]["success"]["count"]
    result = _perf(live, protocol, "--processes", "2", capsys=capsys)
    after = live.statistics("cnn")["model_stats"][0]["inference_stats"]["success"]["count"]
    assert result["processes"] == 2 and result["errors"] == 0 and result["requests"] > 0
    assert result["server_us"]["compute_infer"] > 0 and result["client_cpu_us"] > 0
    # Both processes sent requests: more than one process's share (the window, warm-up and tail included).
    assert after - before >= result["requests"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_system_shared_memory_load(live: Any, protocol: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tritonclient.utils.shared_memory")
    result = _perf(live, protocol, "--shared-memory", "system", capsys=capsys)
    assert result["errors"] == 0 and result["requests"] > 0, result["first_error"]
    assert live.server.shared_memory.status("system") == []  # the client unregistered its regions


def _connections_to(port: int) -> int:
    """Established TCP connections of this process whose remote port is ``port`` (its client side)."""
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


@pytest.mark.parametrize(("share", "channels"), [(0, 1), (3, 3), (6, 2), (8, 1)])
def test_grpc_requests_share_a_channel_up_to_the_limit(live: Any, share: int, channels: int) -> None:
    """8 concurrent requests over ceil(8 / share) connections (6: tritonclient's C++ rule; 0, the default: one):
    with front-end processes on one port the kernel spreads connections, and one connection per client process
    left some of them idle (2026-12-05: 8 connections on 4-6 of 8 front ends)."""
    pytest.importorskip("grpc")
    assert LoadConfig(url="x:1", model="m").grpc_channel_share == 0
    cfg = LoadConfig(url=f"127.0.0.1:{live.grpc_port}", model="cnn", protocol="grpc", batch_size=2,
                     grpc_channel_share=share)

    async def load() -> int:
        before = _connections_to(live.grpc_port)
        client, regions, _ = await _open(cfg, 8)
        try:
            await asyncio.gather(*(client.infer(None, worker) for worker in range(8)))
            return _connections_to(live.grpc_port) - before
        finally:
            await _close(client, regions)

    assert asyncio.run(load()) == channels


def test_client_limit_warning() -> None:
    cfg = LoadConfig(url="x:1", model="m", duration_s=2.0)
    busy = _merge(cfg, 4, [_Part(latencies=[1.0] * 10, cpu_s=2.0 * (CLIENT_BUSY_WARNING + 0.1))])
    idle = _merge(cfg, 4, [_Part(latencies=[1.0] * 10, cpu_s=2.0 * (CLIENT_BUSY_WARNING - 0.3))])
    assert "client may be the limit" in busy.warning and not idle.warning
    assert busy.client_cpu_us == pytest.approx(2.0 * (CLIENT_BUSY_WARNING + 0.1) / 10 * 1e6)


def test_config_checks() -> None:
    with pytest.raises(streamrt.errors.ConfigError, match="processes"):
        LoadConfig(url="x:1", model="m", processes=0)
    with pytest.raises(streamrt.errors.ConfigError, match="shared_memory"):
        LoadConfig(url="x:1", model="m", shared_memory="gpu")
    with pytest.raises(streamrt.errors.ConfigError, match="grpc_channel_share"):
        LoadConfig(url="x:1", model="m", grpc_channel_share=-1)
    with pytest.raises(streamrt.errors.ConfigError, match="gRPC only"):  # not silently ignored over HTTP
        LoadConfig(url="x:1", model="m", protocol="http", grpc_channel_share=6)


