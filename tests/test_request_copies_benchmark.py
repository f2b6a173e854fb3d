"""CPU smoke run of benchmarks/request_copies.py, and the copies it finds pinned as a regression check.

A real server (one process, and two front-end processes) answers an Identity model over gRPC; the
benchmark's probes count the tensor bytes each step copies. A new copy on the request path (or a
probe that no longer sees its step) changes these numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
TENSOR = 8 * 3 * 224 * 224 * 4  # the 4.8 MB request's tensor (and the Identity model's output)


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict[str, float]]]:
    out = tmp_path_factory.mktemp("copies")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "request_copies.py"), "--requests", "2",
                           "--out", str(out / "copies.md"), "--json", str(out / "copies.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=280, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    table = (out / "copies.md").read_text()
    assert "| grpcio: message -> bytes |" in table and "copies of the tensor" in table
    return dict(json.loads((out / "copies.json").read_text()))


def test_one_process_copies_a_large_tensor_once_in_our_code(copies: dict[str, dict[str, dict[str, float]]]) -> None:
    large = copies["1"]["4.8 MB"]
    # grpcio's two copies (it takes and gives `bytes` only) and the response's one; the input is a view
    assert large["grpcio: message -> bytes"] >= TENSOR and large["grpcio: bytes -> send buffer"] >= TENSOR
    assert large["response: outputs -> message bytes"] == TENSOR
    assert not {k for k in large if k.startswith(("parse", "batch gather", "unattributed", "arena"))}


def test_front_ends_add_one_arena_copy_each_way(copies: dict[str, dict[str, dict[str, float]]]) -> None:
    large = copies["2"]["4.8 MB"]
    assert large["arena write (inputs)"] == TENSOR and large["arena write (outputs)"] == TENSOR
    assert large["response: outputs -> message bytes"] == TENSOR
    assert not {k for k in large if k.startswith(("parse", "batch gather", "unattributed", "channel inline"))}
    small = copies["2"]["64 B"]
    assert small["channel inline (outputs)"] == 64  # a small output travels in the reply, not the arena
