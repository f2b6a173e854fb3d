"""ONNX Runtime session settings shared by the build and the load side: providers, options, errors."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import onnxruntime as ort

from streamrt.device.threads import physical_cores, usable_cores
from streamrt.errors import BuildError, UnsupportedOperatorError
from streamrt.onnx.model import OnnxModel

__all__ = ["MODES", "PROVIDERS", "intra_op_threads", "session_options", "session_providers", "translate"]

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
_LEVELS = {
    0: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    2: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
}
MODES = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL, "parallel": ort.ExecutionMode.ORT_PARALLEL}
# "Could not find an implementation for Foo(13) node with name 'bar'"
_NOT_IMPLEMENTED = re.compile(r"implementation for (\w+)\((\d+)\) node with name '([^']*)'")
# "Fatal error: com.acme:FancyOp(-1) is not a registered function/op"
_NOT_REGISTERED = re.compile(r"(?:([\w.]+):)?(\w+)\((-?\d+)\) is not a registered function/op")
# Domains ONNX Runtime ships kernels for (the ONNX standard, ONNX-ML and its own contrib operators).
DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def intra_op_threads(settings: Mapping[str, Any]) -> int:
    """The plan's ``threads`` (0: ONNX Runtime's default), except in a process confined to some of the machine's CPUs
    (``taskset``, a container's cpuset, ``streamrt serve --engine-cpus``): there ONNX Runtime's default count, one
    per physical core of the machine, comes with each pool thread pinned to a core of its own choosing, outside the
    process's CPUs as well; an explicit count of the cores this process may use (ONNX Runtime's default, within the
    mask) pins nothing, and the threads stay where the process was put."""
    threads = int(settings.get("threads", 0))
    if threads == 0 and usable_cores() < (os.cpu_count() or 1):
        return physical_cores()
    return threads


def session_options(settings: Mapping[str, Any], level: int) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = _LEVELS.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    so.intra_op_num_threads = intra_op_threads(settings)
    so.inter_op_num_threads = int(settings.get("inter_op_threads", 0))
    so.execution_mode = MODES[str(settings.get("execution_mode", "sequential"))]
    so.log_severity_level = 3
    if settings.get("spinning") is not None:  # the plan's `--option spinning=...`; absent: ONNX Runtime's default
        flag = "1" if settings["spinning"] else "0"
        so.add_session_config_entry("session.intra_op.allow_spinning", flag)
        so.add_session_config_entry("session.inter_op.allow_spinning", flag)
    # On x86 CPUs without VNNI, ONNX Runtime's u8s8 int8 kernels multiply byte pairs with
    # VPMADDUBSW, whose int16 sum saturates; this option has the optimizer move int8 weights that
    # could overflow to uint8 (its u8u8 kernels do not saturate). No effect on float models or on
    # CPUs with VNNI. Without it, the same int8 plan was accurate on one machine and not another.
    so.add_session_config_entry("session.x64quantprecision", "1")
    return so


def session_providers(settings: Mapping[str, Any], device_id: int | None = None) -> list[Any]:
    """The providers with their options; ``device_id`` puts the GPU providers on that CUDA device
    (None: their default, device 0)."""
    limit = settings.get("memory_limit_mb")
    out: list[Any] = []
    for name in settings["providers"]:
        options: dict[str, str] = {}
        if name == "CUDAExecutionProvider" and limit:
            options["gpu_mem_limit"] = str(int(limit) * 2**20)
        if name in ("CUDAExecutionProvider", "TensorrtExecutionProvider") and device_id is not None:
            options["device_id"] = str(device_id)
        out.append((name, options) if options else name)
    return out



def translate(exc: Exception, model: OnnxModel | None) -> Exception:
    text = str(exc)
    match = _NOT_IMPLEMENTED.search(text)
    if match:
        op, opset, node = match.groups()
        return UnsupportedOperatorError(
            node, op, int(opset), "onnxruntime", detail=text.splitlines()[0][:200]
        )
    match = _NOT_REGISTERED.search(text)
    if match and model is not None:
        domain, op, _ = match.groups()
        domain = domain or ""
        node = next((n for n in model.proto.graph.node if n.op_type == op and n.domain == domain), None)
        opsets = {imp.domain: int(imp.version) for imp in model.proto.opset_import}
        return UnsupportedOperatorError(
            (node.name or f"{op} #{list(model.proto.graph.node).index(node)}") if node is not None else "?",
            op, opsets.get(domain, 0), "onnxruntime", detail="no kernel registered for this operator", domain=domain,
        )
    where = f" for {model.name}" if model else ""
    return BuildError(f"onnxruntime could not create a session{where}: {text.splitlines()[0][:300]}")

