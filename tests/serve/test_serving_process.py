"""A serving process's settings: its GIL switch interval and collector thresholds, and the heap
frozen after a model load; an embedded server (this test process) keeps the host's settings."""

from __future__ import annotations

import gc
import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

from streamrt.serve.process import GC_THRESHOLDS, SWITCH_INTERVAL_S, keep_freed_memory, settle_heap
from streamrt.testing.models import CATALOGUE
from streamrt.testing.server_process import free_port, stop, wait_ready

ROOT = Path(__file__).resolve().parents[2]


def test_settle_heap_does_nothing_in_a_process_not_set_up_for_serving() -> None:
    before = gc.get_freeze_count(), gc.get_threshold()
    settle_heap()
    assert (gc.get_freeze_count(), gc.get_threshold()) == before


def test_a_serving_process_freezes_its_heap_after_each_load(tmp_path: Path) -> None:
    (tmp_path / "repo" / "cnn" / "1").mkdir(parents=True)
    onnx.save(CATALOGUE["small_cnn"].make(), str(tmp_path / "repo" / "cnn" / "1" / "model.onnx"))
    script = textwrap.dedent(f"""
        import asyncio, gc, json, sys, weakref
        from streamrt.serve.process import configure_serving_process
        from streamrt.serve.core import ServerCore
        from streamrt.serve.configs.config import ServerConfig

        configure_serving_process()

        class Node:
            pass

        async def main():
            a, b = Node(), Node()
            a.other, b.other = b, a  # a cycle alive at the first freeze (as a loaded model's objects are)
            cycle = weakref.ref(a)
            core = ServerCore({str(tmp_path / "repo")!r}, ServerConfig(http_port=None, grpc_port=None))
            await core.start(wait_ready=True)
            after_start = gc.get_freeze_count()
            frozen_first = gc.is_tracked(a) and cycle() is not None
            del a, b  # now garbage, but frozen: only an unfreeze before the next collection frees it
            await core.repository.load("cnn")  # a reload settles again
            after_reload = gc.get_freeze_count()
            collected = cycle() is None
            await core.stop()
            return {{"after_start": after_start, "frozen_first": frozen_first, "after_reload": after_reload,
                     "threshold": gc.get_threshold(), "switch": sys.getswitchinterval(),
                     "cycle_collected": collected}}

        print(json.dumps(asyncio.run(main())))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT / "src"), "STREAMRT_CACHE": str(tmp_path / "cache"),
                              "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["after_start"] > 10_000  # the libraries and the loaded model
    assert result["frozen_first"] and result["cycle_collected"]  # frozen garbage is freed at the next load
    assert result["after_reload"] > 10_000
    assert tuple(result["threshold"]) == GC_THRESHOLDS
    assert abs(result["switch"] - SWITCH_INTERVAL_S) < 1e-9



def _minor_faults(pid: int) -> int:
    """Page faults served without I/O so far (/proc/PID/stat field 10)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def _faults_per_binary_request(tmp_path: Path, env: dict[str, str], requests: int = 20) -> float:
    """A real ``streamrt serve --grpc-server h2corn`` with the null image model; 4.8 MB binary requests from
    tritonclient, one at a time; the server process's minor page faults per request after five warm-ups."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    pytest.importorskip("h2corn")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from serving_frontend import write_repository

    repo = write_repository(tmp_path / "repo", instances=1)
    http, grpc = free_port(), free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "streamrt", "serve", str(repo), "--grpc-server", "h2corn",
                                   "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", "0",
                                   "--model", "null_image"],
                                  stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        wait_ready(http, 120, server, log=log)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        images = np.random.default_rng(0).random((8, 3, 224, 224), dtype=np.float32)  # 4.8 MB
        tensor = grpcclient.InferInput("x", list(images.shape), "FP32")
        tensor.set_data_from_numpy(images)
        for _ in range(5):
            client.infer("null_image", [tensor])
        before = _minor_faults(server.pid)
        for _ in range(requests):
            client.infer("null_image", [tensor])
        return (_minor_faults(server.pid) - before) / requests
    finally:
        stop(server)


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="glibc's malloc thresholds, Linux's /proc")
def test_a_server_reuses_freed_request_memory_instead_of_faulting_in_fresh_pages(tmp_path: Path) -> None:
    """Binary 4.8 MB gRPC requests through h2corn: with glibc's default thresholds (``STREAMRT_MALLOC_TUNING=0``)
    the server touches thousands of fresh pages per request; a serving process reuses the memory it freed."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")
           and not k.startswith("MALLOC_")}
    default = _faults_per_binary_request(tmp_path / "default", {**env, "STREAMRT_MALLOC_TUNING": "0"})
    serving = _faults_per_binary_request(tmp_path / "serving", env)
    print(f"faults per request: defaults {default:.0f}, serving {serving:.0f}")
    assert default > 1000, f"glibc's defaults faulted {default:.0f} pages per request: nothing to show"
    assert serving < default / 10, f"{serving:.0f} page faults per 4.8 MB request (defaults: {default:.0f})"


def test_malloc_settings_of_the_users_own_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMRT_MALLOC_TUNING", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert keep_freed_memory() == "malloc left as configured (MALLOC_TRIM_THRESHOLD_)"
    monkeypatch.setenv("STREAMRT_MALLOC_TUNING", "0")
    assert keep_freed_memory() == "malloc left as glibc sets it (STREAMRT_MALLOC_TUNING=0)"
