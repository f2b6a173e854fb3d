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

from streamrt.errors import MissingDependencyError

__all__ = ["available", "require"]

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
