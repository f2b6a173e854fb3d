"""Backend registry: name -> backend class, imported lazily.

This table is the only place that knows which backends exist; nothing else in StreamRT
branches on backend names. A backend whose library is missing raises
:class:`MissingDependencyError` naming the extra to install.

Example:
    >>> get_backend("onnxruntime").version()                      # doctest: +SKIP
    '1.32.0'
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from functools import cache

from streamrt.backends.base import Backend
from streamrt.errors import ConfigError, MissingDependencyError

__all__ = ["BACKENDS", "BackendEntry", "available_backends", "get_backend"]


@dataclass(frozen=True)
class BackendEntry:
    """Where a backend lives and what it needs."""

    module: str
    cls: str
    package: str  # the import name of its heavy library
    pip_extra: str  # the pip extra that installs it
    summary: str


BACKENDS: dict[str, BackendEntry] = {
    "onnxruntime": BackendEntry(
        "streamrt.backends.onnxruntime.backend",
        "OnnxRuntimeBackend",
        "onnxruntime",
        "core",
        "ONNX Runtime (CPU by default; CUDA/TensorRT providers with onnxruntime-gpu)",
    ),
    "torch_inductor": BackendEntry(
        "streamrt.backends.torch_inductor.backend",
        "TorchInductorBackend",
        "torch",
        "torch",
        "PyTorch torch.export + AOTInductor packages (GPU, or CPU through Inductor's C++ path)",
    ),
    "tensorrt": BackendEntry(
        "streamrt.backends.tensorrt.backend",
        "TensorRTBackend",
        "tensorrt",
        "tensorrt",
        "NVIDIA TensorRT 10.x / 11.x serialized engines",
    ),
}


@cache
def get_backend(name: str) -> Backend:
    """The backend registered under ``name`` (one shared instance per process)."""
    entry = BACKENDS.get(name)
    if entry is None:
        raise ConfigError(f"unknown backend {name!r}; known backends: {', '.join(BACKENDS)}")
    try:
        module = importlib.import_module(entry.module)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == entry.package:
            raise MissingDependencyError(entry.package, entry.pip_extra, purpose=f"the {name} backend") from exc
        raise
    backend: Backend = getattr(module, entry.cls)()
    return backend


def available_backends() -> list[str]:
    """Backends whose library imports on this machine."""
    names = []
    for name, entry in BACKENDS.items():
        if importlib.util.find_spec(entry.package) is not None:
            names.append(name)
    return names
