"""The ONNX Runtime backend's registry face: versions, target device, compatibility and load.

Loading a plan goes through this module and :mod:`.engine` only; :meth:`OnnxRuntimeBackend.build`
imports :mod:`.builder` (the graph optimizer pass) when a build asks for it, so a process that
only loads plans never imports the build side (STYLE.md 2: build and run are separate).

Optimized models at the highest level can contain CPU-specific layouts (NCHWc), so a plan is
tied to the ONNX Runtime version and the processor architecture it was built on.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from streamrt._features import cpu_simd_level
from streamrt.backends.base import Backend, BuildJob, BuildOutput
from streamrt.backends.onnxruntime.session import DOMAINS, PROVIDERS
from streamrt.config import BuildConfig
from streamrt.plan import Plan

if TYPE_CHECKING:
    from streamrt.backends.onnxruntime.engine import OnnxRuntimeEngine

__all__ = ["OnnxRuntimeBackend"]


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
        from streamrt.backends.onnxruntime.builder import optimize  # the build side, only when building

        return optimize(job)

    def describe_payload(self, payload: bytes) -> dict[str, Any]:
        import onnx

        from streamrt.onnx.model import model_from_proto

        optimized = model_from_proto(onnx.load_from_string(payload), check=False)
        return {"op_histogram": optimized.op_histogram()}

    def load(self, plan: Plan) -> OnnxRuntimeEngine:
        from streamrt.backends.onnxruntime.engine import OnnxRuntimeEngine

        return OnnxRuntimeEngine(plan.manifest, plan.payload)
