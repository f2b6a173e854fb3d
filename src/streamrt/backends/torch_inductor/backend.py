"""The torch_inductor backend's registry face: versions, target device, compatibility and load.

Loading a plan goes through this module and :mod:`.engine` only. :meth:`TorchInductorBackend.build`
and :meth:`~TorchInductorBackend.build_from_module` import :mod:`.builder` (the ONNX importer,
``torch.export``, AOTInductor) when a build asks for them, so a process that only loads plans
never imports the build side (STYLE.md 2: build and run are separate).

Load: packages are extracted to a private directory and loaded with
``torch._inductor.package.load_package``; each execution context gets its own runner (so
contexts on different streams never contend for one model container's lock), which
duplicates the weights per context: keep contexts few for large models.

A plan records torch, CUDA and GPU architecture (or the CPU ISA); loading it elsewhere fails
with the standard mismatch message. See ``docs/gpu-backend.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from streamrt._features import cuda_available
from streamrt.backends.base import Backend, BuildJob, BuildOutput, Engine, Progress
from streamrt.backends.torch_inductor.levels import resolve_recipe
from streamrt.backends.torch_inductor.target import device_kind, device_target, refuse_gpu_int8, runtime_versions
from streamrt.config import BuildConfig
from streamrt.plan import Plan, PlanManifest, check_field
from streamrt.types import ShapeProfile

__all__ = ["TorchInductorBackend"]


class TorchInductorBackend(Backend):
    """Builds AOTInductor packages (GPU or CPU) and loads them into engines."""

    name = "torch_inductor"
    pip_extra = "torch"
    precisions = frozenset({"fp32", "tf32", "fp16", "bf16", "int8"})
    _CUDA_FIELDS = ("kind", "name", "compute_capability", "cuda")
    _CPU_FIELDS = ("kind", "arch", "isa")

    def version(self) -> str:
        return str(torch.__version__)

    def runtime_versions(self) -> dict[str, str]:
        return runtime_versions()

    def target_device(self, config: BuildConfig) -> dict[str, Any]:
        kind = device_kind(config)
        refuse_gpu_int8(config, kind)  # before calibration: int8 has no GPU kernels here
        return device_target(kind)

    def runs_operator(self, op_type: str, domain: str) -> bool | None:
        from streamrt.onnx.importer.registry import converter_table

        return domain in ("", "ai.onnx") and op_type in converter_table()

    def build_recipe(self, config: BuildConfig) -> dict[str, Any]:
        return resolve_recipe(config, device_kind(config)).to_dict()

    def check_compatible(self, manifest: PlanManifest) -> None:
        check_field(manifest, "torch version", manifest.backend_version, self.version())
        kind = str(manifest.device.get("kind"))
        if kind == "cuda" and not cuda_available():
            check_field(manifest, "device.kind", "cuda", "cpu (no CUDA GPU visible to torch)")
        local = device_target(kind)
        for key in self._CUDA_FIELDS if kind == "cuda" else self._CPU_FIELDS:
            check_field(manifest, f"device.{key}", manifest.device.get(key), local.get(key))

    def build(self, job: BuildJob) -> BuildOutput:
        from streamrt.backends.torch_inductor.builder import build_onnx  # the build side, only when building

        return build_onnx(job)

    def build_from_module(
        self,
        module: torch.nn.Module,
        names: Sequence[str],
        dtypes: Sequence[torch.dtype],
        config: BuildConfig,
        profiles: tuple[ShapeProfile, ...],
        progress: Progress,
        kind: str,
        started: float | None = None,
    ) -> BuildOutput:
        """Export and compile an imported (or user) module: :func:`.builder.build_from_module`."""
        from streamrt.backends.torch_inductor.builder import build_from_module

        return build_from_module(module, names, dtypes, config, profiles, progress, kind, started)

    def load(self, plan: Plan) -> Engine:
        from streamrt.backends.torch_inductor.engine import TorchInductorEngine

        return TorchInductorEngine(plan.manifest, plan.payload)
