"""The one helper for optional dependencies: import a module or raise one clear error naming the extra.

Every optional import in StreamRT (torch, OpenCV, aiohttp, grpcio, matplotlib, tensorrt, ...) goes
through :func:`require`, so a missing extra is always the same one-line
:class:`~streamrt.errors.MissingDependencyError` with the command that installs it, and
:func:`available` answers "is it there?" without raising.

Example:
    >>> np = require("numpy", extra="core", purpose="arrays")
    >>> available("numpy")
    True
"""

from __future__ import annotations

import importlib
from types import ModuleType

from streamrt.errors import MissingDependencyError, install_hint

__all__ = ["EXTRAS", "available", "install_hint", "missing_dependency", "require"]

# The PyPI name when it differs from the module name, for the message.
_DISTRIBUTIONS = {
    "cv2": "opencv-python-headless",
    "yaml": "pyyaml",
    "grpc": "grpcio",
    "pynvml": "nvidia-ml-py",
    "PIL": "pillow",
    "PyNvVideoCodec": "pynvvideocodec",
    "av": "av",
    "google": "protobuf",
    "cuda": "cuda-python",
    "opentelemetry": "opentelemetry-sdk",
}

# The extra that installs each optional module (pyproject.toml's [project.optional-dependencies]),
# for turning a bare ModuleNotFoundError (a script's own ``import torch``) into the same message.
EXTRAS = {
    "torch": "torch",
    "torchvision": "torch",
    "matplotlib": "plot",
    "PIL": "vision",
    "cv2": "video",
    "av": "video",
    "aiohttp": "serve",
    "grpc": "serve",
    "google": "serve",
    "tritonclient": "serve",
    "uvloop": "serve",
    "pynvml": "serve",
    "tensorrt": "tensorrt",
    "cuda": "cuda-shm",
    "ray": "ray",
    "opentelemetry": "otel",
}


def require(module: str, *, extra: str, purpose: str = "") -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming ``extra``.

    Not cached here: ``sys.modules`` already makes a repeated import cheap, and a module hidden
    later (``sys.modules[name] = None``, as tests do) must fail the way a missing one does.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = _DISTRIBUTIONS.get(module.split(".")[0], module.split(".")[0])
        raise MissingDependencyError(package, extra, purpose=purpose) from exc


def available(module: str) -> bool:
    """True when ``module`` imports; not cached, for the same reason as :func:`require`."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing_dependency(exc: BaseException) -> MissingDependencyError | None:
    """``exc`` as the one-line error naming the extra, or None when it is not a missing optional module.

    A :class:`MissingDependencyError` is returned as it is; a ``ModuleNotFoundError`` for a module
    in :data:`EXTRAS` (``import torch`` where torch is not installed) becomes one. The examples'
    guard (``examples/_common.py``) prints the result instead of a traceback.
    """
    if isinstance(exc, MissingDependencyError):
        return exc
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    if top not in EXTRAS:
        return None
    return MissingDependencyError(_DISTRIBUTIONS.get(top, top), EXTRAS[top])
