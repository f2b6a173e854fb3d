"""Skip capability-marked tests where the capability is missing, with the reason."""

from __future__ import annotations

import importlib.util

import pytest


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
