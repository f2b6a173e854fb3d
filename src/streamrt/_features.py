"""Feature probes: what this machine and this Python environment can do, asked in one place.

Every "is torch / CUDA / Triton / OpenCV here?", "which GPU is this?" and "which CPU
instruction set do kernels compile for?" question in StreamRT goes through this module, so
each answer has one definition. Probes never raise for a missing library: they answer False or
None. Answers that cannot change while the process runs are cached.

Example:
    >>> isinstance(cuda_available(), bool)
    True
"""

from __future__ import annotations

import importlib.util
import platform
from functools import cache
from pathlib import Path
from typing import Any

from streamrt._optional import available

__all__ = [
    "cpu_capability",
    "cpu_simd_level",
    "cuda_available",
    "cuda_target",
    "current_cuda_device",
    "cv2_available",
    "torch_available",
    "triton_importable",
]


def torch_available() -> bool:
    """True when torch imports."""
    return available("torch")


def cuda_available() -> bool:
    """True when torch is installed and sees a CUDA GPU."""
    if not torch_available():
        return False
    import torch

    return bool(torch.cuda.is_available())


@cache
def triton_importable() -> bool:
    """True when ``import triton`` would work (found without importing it: the import is slow)."""
    return importlib.util.find_spec("triton") is not None


def cv2_available() -> bool:
    """True when OpenCV imports."""
    return available("cv2")


def cuda_target() -> dict[str, Any] | None:
    """The current GPU as a plan records it (name, compute capability, CUDA), or None without one."""
    if not cuda_available():
        return None
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "kind": "cuda",
        "name": str(props.name),
        "compute_capability": f"{props.major}.{props.minor}",
        "cuda": str(torch.version.cuda),
    }


def current_cuda_device() -> int | None:
    """The calling thread's current CUDA device index when torch is already imported and sees a GPU, else None.

    Asked without importing torch (ONNX Runtime's GPU providers read it to pick their device): a process
    that never imported torch never chose a device other than 0.
    """
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return int(torch.cuda.current_device())


@cache
def cpu_capability() -> str:
    """The vector ISA torch's CPU kernels (and Inductor's generated C++) are built for.

    torch's own answer (``torch.backends.cpu.get_cpu_capability()``: ``"AVX512"``, ``"AVX2"``,
    ``"DEFAULT"``, ...), so a CPU plan records what the compiler targeted, not a guess from flags.
    """
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


@cache
def cpu_simd_level() -> str:
    """The widest SIMD level ONNX Runtime's CPU kernels pick (it decides the NCHWc block size).

    Read from ``/proc/cpuinfo`` flags on purpose: the ONNX Runtime backend does not depend on
    torch, and its plans have always recorded these lower-case names (``avx512f``, ``avx2``...).
    """
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return platform.machine()
    for isa in ("avx512f", "avx2", "avx", "asimd", "neon"):
        if isa in flags:
            return isa
    return "generic"
