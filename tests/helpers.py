"""Small model builders and waiting helpers shared by tests."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from streamrt.testing.models import CATALOGUE


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def catalogue_file(name: str, folder: Path) -> Path:
    return save(CATALOGUE[name].make(), folder / f"{name}.onnx")


def unsupported_op_model() -> onnx.ModelProto:
    """Valid ONNX that ONNX Runtime's CPU provider has no kernel for (bfloat16 Sqrt)."""
    graph = helper.make_graph(
        [helper.make_node("Sqrt", ["x"], ["y"], name="sqrt_bf16")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def checker_failing_model() -> onnx.ModelProto:
    """A node reading a tensor nothing produces: the ONNX checker rejects it."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["nowhere"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` every 10 ms; fail with ``what`` after ``timeout`` seconds (no timing margins in tests)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def thread_masks(pid: int) -> set[frozenset[int]]:
    """The CPU masks of ``pid``'s threads, read from /proc (a thread that exits meanwhile is left out)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            found.add(frozenset(os.sched_getaffinity(int(task.name))))
    return found
