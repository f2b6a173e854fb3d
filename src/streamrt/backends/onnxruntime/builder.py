"""ONNX Runtime backend: StreamRT's embedded default, runs on any machine.

Build runs ONNX Runtime's graph optimizer (highest level by default) once and stores the
optimized model in the plan, so loading skips optimization and takes milliseconds. Session
settings (threads, execution mode, providers) are recorded in the plan and reused at load.

The CPU execution provider is the default. With ``onnxruntime-gpu`` installed,
``backend_options={"providers": ["CUDAExecutionProvider"]}`` (CLI: ``--provider cuda``)
selects CUDA or TensorRT execution providers; that path is present but only tested where
such a provider is available.

Optimized models at the highest level can contain CPU-specific layouts (NCHWc), so a plan is
tied to the ONNX Runtime version and the processor architecture it was built on.
"""

from __future__ import annotations

import platform
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from streamrt._features import cpu_simd_level
from streamrt.backends.base import Backend, BuildJob, BuildOutput
from streamrt.backends.onnxruntime.session import (
    DOMAINS,
    MODES,
    PROVIDERS,
    session_options,
    session_providers,
    translate,
)
from streamrt.config import BuildConfig
from streamrt.errors import ConfigError
from streamrt.plan import Plan

if TYPE_CHECKING:
    from streamrt.backends.onnxruntime.engine import OnnxRuntimeEngine

__all__ = ["OnnxRuntimeBackend"]


_OPTIONS = ("providers", "threads", "inter_op_threads", "execution_mode")
_THREAD_OPTIONS = ("threads", "inter_op_threads")


def _thread_count(opts: dict[str, Any], key: str) -> int:
    """A thread-count option, checked where the option table is: ``threads=abc`` or ``threads=-3``
    is a one-line ConfigError, not a ValueError from ``int()`` or a session that ignores it."""
    value = opts.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"onnxruntime option {key} must be an integer >= 0 (0 = automatic), got {value!r}",
                          hint=f"--option {key}=N with N >= 0")
    return value


def _session_settings(config: BuildConfig) -> dict[str, Any]:
    opts = dict(config.backend_options)
    unknown = sorted(set(opts) - set(_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown onnxruntime backend options {unknown}; known: {', '.join(_OPTIONS)}")
    threads = {key: _thread_count(opts, key) for key in _THREAD_OPTIONS}
    providers = [PROVIDERS.get(p, p) for p in opts.get("providers", ["cpu"])]
    missing = [p for p in providers if p not in ort.get_available_providers()]
    if missing:
        raise ConfigError(
            f"onnxruntime execution providers {missing} are not available here "
            f"(available: {', '.join(ort.get_available_providers())})",
            hint="install onnxruntime-gpu for CUDA/TensorRT providers",
        )
    mode = str(opts.get("execution_mode", "sequential"))
    if mode not in MODES:
        raise ConfigError(f"execution_mode must be sequential or parallel, got {mode!r}")
    return {
        "providers": providers,
        "threads": threads["threads"],
        "inter_op_threads": threads["inter_op_threads"],
        "execution_mode": mode,
        "graph_optimization_level": config.optimization_level,
        "memory_limit_mb": config.memory_limit_mb,
    }


class OnnxRuntimeBackend(Backend):
    """Builds optimized ONNX models for ONNX Runtime and loads them into sessions."""

    name = "onnxruntime"
    pip_extra = "core"
    device_fields = ("kind", "arch", "isa")
    # bf16 and tf32 have no CPU kernels in ONNX Runtime for most operators.
    precisions = frozenset({"fp32", "fp16", "int8"})
    int8_style = "onnxruntime"

    def version(self) -> str:
        return str(ort.__version__)

    def runs_operator(self, op_type: str, domain: str) -> bool | None:
        return domain in DOMAINS

    def runtime_versions(self) -> dict[str, str]:
        import onnx

        return {"onnxruntime": self.version(), "onnx": str(onnx.__version__), "numpy": np.__version__}

    def target_device(self, config: BuildConfig) -> dict[str, Any]:
        providers = [PROVIDERS.get(p, p) for p in config.backend_options.get("providers", ["cpu"])]
        kind = "cuda" if any(p != "CPUExecutionProvider" for p in providers) else "cpu"
        return {"kind": kind, "arch": platform.machine(), "isa": cpu_simd_level(), "providers": providers}

    def build(self, job: BuildJob) -> BuildOutput:
        model, config, progress = job.model, job.config, job.progress  # no cache of its own: the plan cache is enough
        settings = _session_settings(config)
        level = config.optimization_level
        progress(f"optimizing graph (onnxruntime {self.version()}, level {level})")
        with tempfile.TemporaryDirectory(prefix="streamrt-ort-") as tmp:
            optimized = Path(tmp) / "optimized.onnx"
            so = session_options(settings, level)
            so.optimized_model_filepath = str(optimized)
            try:
                ort.InferenceSession(model.data, sess_options=so, providers=session_providers(settings))
            except Exception as exc:  # onnxruntime raises its own pybind exception types
                raise translate(exc, model) from exc
            payload = optimized.read_bytes() if optimized.exists() else model.data
        return BuildOutput(payload=payload, settings=settings)

    def describe_payload(self, payload: bytes) -> dict[str, Any]:
        import onnx

        from streamrt.onnx.model import model_from_proto

        optimized = model_from_proto(onnx.load_from_string(payload), check=False)
        return {"op_histogram": optimized.op_histogram()}

    def load(self, plan: Plan) -> OnnxRuntimeEngine:
        from streamrt.backends.onnxruntime.engine import OnnxRuntimeEngine

        return OnnxRuntimeEngine(plan.manifest, plan.payload)

