"""Out of memory while building, loading or running: one OutOfMemoryError line, exit 2, no partial plan.

Host memory is exhausted for real at the allocation points (reading the plan, reading the
optimized model, copying inputs): the patched function performs an allocation NumPy cannot satisfy.
"""

from __future__ import annotations

import pathlib
from pathlib import Path

import numpy as np
import pytest

import streamrt
from helpers import catalogue_file
from streamrt._oom import out_of_memory_guard
from streamrt.cli.main import main
from streamrt.errors import OutOfMemoryError
from streamrt.testing.models import CATALOGUE

_read_bytes = pathlib.Path.read_bytes


def _exhaust_host_memory() -> None:
    np.empty((1 << 42,), np.float32)  # 16 TiB: NumPy raises MemoryError "Unable to allocate 16.0 TiB ..."


def _fail_reading(monkeypatch: pytest.MonkeyPatch, name_matches: str) -> None:
    def read_bytes(self: Path) -> bytes:
        if self.match(name_matches):
            _exhaust_host_memory()
        return _read_bytes(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)


def test_build_out_of_memory_is_one_error_and_leaves_no_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = catalogue_file("matmul", tmp_path)
    out = tmp_path / "out"
    _fail_reading(monkeypatch, "optimized.onnx")  # the backend reads its optimized graph into the payload
    with pytest.raises(OutOfMemoryError) as info:
        streamrt.build(src, output=out / "m.plan", cache_dir=tmp_path / "cache")
    assert str(info.value).startswith("out of host memory while building matmul.onnx with onnxruntime "
                                      "(tried to allocate 16.0 TiB)")
    assert "--max-shapes" in (info.value.hint or "")
    assert not out.exists() or list(out.iterdir()) == []
    assert not list((tmp_path / "cache").rglob("*.plan"))


def test_load_and_bench_out_of_memory_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    plan = streamrt.build(catalogue_file("matmul", tmp_path), output=tmp_path / "m.plan", cache=False).path
    _fail_reading(monkeypatch, "*.plan")
    with pytest.raises(OutOfMemoryError, match=r"out of host memory while loading plan .*m\.plan \(0\.\d MiB\)"):
        streamrt.load(plan)
    assert main(["bench", str(plan)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("streamrt bench: error: out of host memory while loading plan")
    assert "tried to allocate 16.0 TiB" in err[0] and "hint:" in err[0]


def test_inference_out_of_memory_names_the_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = streamrt.build(catalogue_file("matmul", tmp_path), output=tmp_path / "m.plan", cache=False).path
    ctx = streamrt.load(plan).create_context()
    inputs = CATALOGUE["matmul"].inputs(np.random.default_rng(), 3)

    def ascontiguousarray(*args: object, **kwargs: object) -> np.ndarray:
        _exhaust_host_memory()
        raise AssertionError("unreachable")

    monkeypatch.setattr(np, "ascontiguousarray", ascontiguousarray)  # the copy of the inputs ONNX Runtime reads
    with pytest.raises(OutOfMemoryError) as info:
        ctx.infer(inputs)
    assert str(info.value).startswith("out of host memory while running onnxruntime inference on x 3x32")
    assert "--workers" in (info.value.hint or "")


def test_cli_turns_a_stray_memory_error_into_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    src = catalogue_file("matmul", tmp_path)
    _fail_reading(monkeypatch, "matmul.onnx")  # `inspect` reads the model outside any guarded path
    assert main(["inspect", str(src)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("streamrt inspect: error: out of host memory: Unable to allocate")


@pytest.mark.gpu
def test_cuda_out_of_memory_is_reported_with_its_size() -> None:
    import torch

    with pytest.raises(OutOfMemoryError) as info, out_of_memory_guard("allocating a test tensor", "try less"):
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB
    assert info.value.memory == "CUDA device" and info.value.requested is not None


def test_server_answers_out_of_memory_as_resource_exhausted() -> None:
    from streamrt.serve.wire.status import status_for

    error = OutOfMemoryError("running onnxruntime inference on x 3x32", memory="host", requested=None, hint="h")
    assert (status_for(error).http, status_for(error).grpc) == (503, "RESOURCE_EXHAUSTED")


def test_torch_cpu_allocator_failure_is_out_of_host_memory() -> None:
    """torch's CPU allocator raises RuntimeError('[enforce fail at alloc_cpu.cpp:...]'), not MemoryError
    (issue 29): the device's allocation says out of host memory, with the size in TiB."""
    torch = pytest.importorskip("torch")
    from streamrt.device import get_device

    with pytest.raises(OutOfMemoryError) as info:
        get_device("cpu").empty((2**46,), torch.uint8)  # 64 TiB
    assert info.value.memory == "host" and info.value.requested == "64.0 TiB"
    assert "alloc_cpu" not in str(info.value) and info.value.hint


@pytest.mark.timeout(300)
def test_example_09_reports_out_of_memory_as_the_docs_show(tmp_path: Path) -> None:
    """examples/09 writes its table of errors; the out-of-memory row is OutOfMemoryError (docs/errors.md)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "STREAMRT_CACHE": str(tmp_path / "cache"),
           "MPLBACKEND": "Agg", "STREAMRT_EXAMPLES_SMALL": "1"}
    proc = subprocess.run([sys.executable, str(root / "examples" / "09_errors.py"), "--device", "cpu", "--out",
                           str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = next(line for line in (tmp_path / "out" / "errors.md").read_text().splitlines()
               if line.startswith("| out of memory |"))
    assert "`OutOfMemoryError`" in row and "out of host memory" in row and "enforce fail" not in row
