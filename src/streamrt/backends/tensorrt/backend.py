"""The TensorRT backend's registry face: versions, target GPU, compatibility and load.

Loading a plan goes through this module and :mod:`.engine` only; :meth:`TensorRTBackend.build`
imports :mod:`.builder` (parser, builder config, timing cache) when a build asks for it, so a
process that only loads plans never imports the build side (STYLE.md 2). The compatibility
rules themselves (version- and hardware-compatible plans) live in :mod:`.compat`.
"""

from __future__ import annotations

from typing import Any

import tensorrt as trt

from streamrt._features import cuda_target
from streamrt._optional import require
from streamrt.backends.base import Backend, BuildJob, BuildOutput, Engine
from streamrt.backends.tensorrt import compat
from streamrt.config import BuildConfig
from streamrt.errors import ConfigError
from streamrt.plan import Plan, PlanManifest

__all__ = ["TensorRTBackend", "local_gpu"]


def _torch() -> Any:
    return require("torch", extra="torch", purpose="the tensorrt backend's GPU memory and streams")


def local_gpu() -> dict[str, Any] | None:
    """This machine's GPU as a plan records it (name, compute capability, CUDA), or None without one."""
    _torch()  # a missing torch names its extra instead of reading as "no GPU"
    return cuda_target()


class TensorRTBackend(Backend):
    """Builds serialized TensorRT engines and loads them into :class:`TensorRTEngine` objects."""

    name = "tensorrt"
    pip_extra = "tensorrt"
    device_fields = ("name", "compute_capability")
    # Precision is decided in the ONNX graph; "tf32" only leaves TensorRT's TF32 flag on.
    precisions = frozenset({"fp32", "tf32", "fp16", "bf16", "int8"})

    def version(self) -> str:
        return str(trt.__version__)

    def runtime_versions(self) -> dict[str, str]:
        torch = _torch()
        return {"tensorrt": self.version(), "torch": str(torch.__version__), "cuda": str(torch.version.cuda)}

    def runs_operator(self, op_type: str, domain: str) -> bool | None:
        # Its ONNX parser covers the standard domain; anything else needs a plugin.
        return None if domain in ("", "ai.onnx") else False

    def target_device(self, config: BuildConfig) -> dict[str, Any]:
        device = local_gpu()
        if device is None:
            raise ConfigError("the tensorrt backend builds for a CUDA GPU, and torch sees none on this machine")
        return device

    def check_compatible(self, manifest: PlanManifest) -> None:
        """TensorRT version and GPU must match, except where the plan was built version/hardware compatible."""
        compat.check_plan(manifest, self.version(), local_gpu())

    def build(self, job: BuildJob) -> BuildOutput:
        from streamrt.backends.tensorrt.builder import build  # the build side, only when building

        return build(job, self.target_device(job.config))

    def load(self, plan: Plan) -> Engine:
        _torch()  # the engine side needs torch: a missing one names its extra
        from streamrt.backends.tensorrt.engine import TensorRTEngine

        return TensorRTEngine(plan.manifest, plan.payload)
