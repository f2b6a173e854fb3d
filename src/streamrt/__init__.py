"""StreamRT: build fast inference engines and keep the GPU busy while they run.

Example:
    >>> import streamrt
    >>> config = streamrt.BuildConfig(precision="fp16")
    >>> result = streamrt.build("model.onnx", config, "model.plan")      # doctest: +SKIP
    >>> engine = streamrt.load(result.path)                              # doctest: +SKIP
    >>> engine = streamrt.open("model.onnx", config, max_batch=32)      # doctest: +SKIP
    >>> outputs = engine.create_context().infer({"images": batch})       # doctest: +SKIP

``streamrt.open`` is the short way: a plan is loaded, an ONNX model is built through the cache
(with a batch profile 1..``max_batch``) and its plan loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "BuildConfig",
    "BuildResult",
    "DType",
    "Engine",
    "ExecutionContext",
    "Precision",
    "ShapeProfile",
    "ShapeRange",
    "StreamRTError",
    "TensorSpec",
    "__version__",
    "build",
    "build_module",
    "load",
    "open",
]

from streamrt._version import __version__
from streamrt.config import BuildConfig, Precision
from streamrt.errors import StreamRTError
from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec

if TYPE_CHECKING:
    from streamrt.backends.base import Engine, ExecutionContext
    from streamrt.building.builder import BuildResult, build
    from streamrt.building.module_builder import build_module
    from streamrt.building.opening import open
    from streamrt.running.runtime import load

_LAZY = {
    "build": ("streamrt.building.builder", "build"),
    "BuildResult": ("streamrt.building.builder", "BuildResult"),
    "load": ("streamrt.running.runtime", "load"),
    "open": ("streamrt.building.opening", "open"),
    "build_module": ("streamrt.building.module_builder", "build_module"),
    "Engine": ("streamrt.backends.base", "Engine"),
    "ExecutionContext": ("streamrt.backends.base", "ExecutionContext"),
}


def __getattr__(name: str) -> Any:
    # Lazy so that `import streamrt` stays cheap and a plan-only runtime never imports builders.
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'streamrt' has no attribute {name!r}")
