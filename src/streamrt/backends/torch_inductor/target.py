"""What a torch_inductor plan is tied to: the device kind a build asks for, that device's identity, the versions."""

from __future__ import annotations

import platform
from typing import Any

from streamrt._features import cpu_capability, cuda_available, cuda_target
from streamrt._optional import available, require
from streamrt.config import BuildConfig
from streamrt.errors import ConfigError

__all__ = ["cpu_target_note", "device_kind", "device_target", "refuse_gpu_int8", "runtime_versions"]


def runtime_versions() -> dict[str, str]:
    """torch, CUDA and (where installed) Triton versions: what a plan's packages depend on.

    Shared by the backend (recorded in the plan) and the builder (the ``--timing-cache`` identity).
    """
    import torch

    versions = {"torch": str(torch.__version__), "cuda": str(torch.version.cuda)}
    if available("triton"):
        versions["triton"] = str(require("triton", extra="torch").__version__)
    return versions


def device_target(kind: str) -> dict[str, Any]:
    """What a package is tied to: GPU name, compute capability and CUDA version, or the CPU ISA.

    The CPU ISA is torch's own ``get_cpu_capability()``: what Inductor's C++ kernels compile for.
    """
    if kind == "cuda":
        target = cuda_target()
        if target is None:
            raise ConfigError("torch_inductor device=cuda was asked for but torch sees no CUDA GPU")
        return target
    return {"kind": "cpu", "arch": platform.machine(), "isa": cpu_capability()}


def device_kind(config: BuildConfig) -> str:
    """``cuda`` or ``cpu``: the ``device`` backend option resolved on this machine."""
    wanted = str(config.backend_options.get("device", "auto"))
    if wanted not in ("auto", "cuda", "cpu"):
        raise ConfigError(f"torch_inductor option device must be auto, cuda or cpu, got {wanted!r}")
    if wanted == "cuda" and not cuda_available():
        raise ConfigError("torch_inductor device=cuda was asked for but torch sees no CUDA GPU")
    if wanted == "auto":
        return "cuda" if cuda_available() else "cpu"
    return wanted


def cpu_target_note(config: BuildConfig, kind: str) -> str | None:
    """The line a build says when it makes a CPU plan only because no GPU is here, else None.

    ``device=auto`` (the default) falls back to the CPU on a machine without CUDA; the plan then
    holds C++ kernels for this CPU's ISA and never runs on a GPU (on a GPU machine it loads only
    where the CPU matches, and runs there on the CPU), which a user who ran a "GPU backend"
    command would not expect. ``device=cpu`` asked for it, so nothing is said.
    """
    if kind != "cpu" or str(config.backend_options.get("device", "auto")) != "auto":
        return None
    isa = device_target("cpu")["isa"]
    return (f"no CUDA device: building a CPU plan (C++ kernels for this CPU, {isa}); it will not run on a GPU "
            "(build on the GPU machine for a GPU plan, or pass --option device=cpu to ask for a CPU plan)")


def refuse_gpu_int8(config: BuildConfig, kind: str) -> None:
    """torch_inductor int8 on CUDA is refused: it would run no int8 kernels there.

    The importer turns Q/DQ nodes into float arithmetic and runs integer convolutions and matmuls
    in float64 (``onnx/importer/ops_quant.py``), which is exact on any device but, on a GPU, far
    slower than the fp16 plan and no more accurate. On the CPU it stays available as an accuracy
    preview (the int8 speed check reports its speed).
    """
    if kind == "cuda" and config.precision.value == "int8":
        raise ConfigError(
            "torch_inductor has no int8 GPU kernels: an int8 plan would compute Q/DQ in float and integer "
            "convolutions/matmuls in float64 on the GPU, slower than fp16",
            hint="on the GPU build --precision fp16 (or bf16) with torch_inductor; for int8 use --backend tensorrt "
                 "on the GPU, or --backend onnxruntime on the CPU (torch_inductor's float int8 preview: "
                 "--option device=cpu)",
        )
