"""Skip capability-marked tests where the capability is missing, with the reason; start every run
from empty caches.

A test run must see what a fresh machine sees: StreamRT's build and calibration caches
(``~/.cache/streamrt``) and torch's compile cache (``/tmp/torchinductor_<user>``) left by an
earlier run on a developer's machine could hide a failure that a new machine shows. Each run gets
its own empty folders for both (removed at the end), inherited by the processes tests start.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

_FRESH_CACHES = ("STREAMRT_CACHE", "TORCHINDUCTOR_CACHE_DIR")
_fresh_root: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _fresh_root
    _fresh_root = Path(tempfile.mkdtemp(prefix="streamrt-test-caches-"))
    for name in _FRESH_CACHES:
        folder = _fresh_root / name.lower()
        folder.mkdir()
        os.environ[name] = str(folder)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _fresh_root is not None:
        shutil.rmtree(_fresh_root, ignore_errors=True)


def _has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def _has_cuda() -> bool:
    if not _has_torch():
        return False
    import torch

    return bool(torch.cuda.is_available())


def _has_tensorrt() -> bool:
    return importlib.util.find_spec("tensorrt") is not None


_CAPABILITIES = {
    "torch": (_has_torch, "torch is not installed (pip install 'streamrt[torch]')"),
    "tensorrt": (_has_tensorrt, "TensorRT is not installed (it only comes from NVIDIA's index)"),
    "gpu": (_has_cuda, "no CUDA GPU available"),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cache: dict[str, bool] = {}
    for item in items:
        for marker, (probe, reason) in _CAPABILITIES.items():
            if marker in item.keywords:
                if marker not in cache:
                    cache[marker] = probe()
                if not cache[marker]:
                    item.add_marker(pytest.mark.skip(reason=reason))
