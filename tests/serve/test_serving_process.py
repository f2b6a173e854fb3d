"""A serving process's settings: its GIL switch interval and collector thresholds, and the heap
frozen after a model load; an embedded server (this test process) keeps the host's settings."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx

from streamrt.serve.process import GC_THRESHOLDS, SWITCH_INTERVAL_S, settle_heap
from streamrt.testing.models import CATALOGUE

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
