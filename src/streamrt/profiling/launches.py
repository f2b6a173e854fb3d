"""Kernel launches per inference of a CUDA engine, counted with torch.profiler (CUPTI kernel events).

A launch-bound plan spends more host time launching kernels than the GPU spends running them;
the count says whether CUDA graphs (one launch per inference) will pay. Counted on a separate
context with CUDA graphs off, over a few calls after a warm-up: a graph replays the same kernels,
so the count is the same, and only the number of host launches differs.

Example:
    >>> count_kernel_launches(engine, feeds)      # doctest: +SKIP
    143.0
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

__all__ = ["count_kernel_launches", "describe_launches"]

log = logging.getLogger(__name__)

_NOT_KERNELS = ("memcpy", "memset")


def _plain_context(engine: Any) -> Any:
    try:
        return engine.create_context(cuda_graph=False)
    except TypeError:  # an engine without CUDA-graph support
        return engine.create_context()


def count_kernel_launches(engine: Any, inputs: Mapping[str, Any], calls: int = 5) -> float | None:
    """Mean kernels per ``infer`` call (copies and memsets excluded); ``None`` off CUDA or without CUPTI."""
    if engine.device_kind != "cuda":
        return None
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from streamrt.running.inputs import to_device

    feeds = to_device({k: v for k, v in inputs.items()}, "cuda") if _on_host(inputs) else dict(inputs)
    ctx = _plain_context(engine)
    try:
        ctx.infer(feeds)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                ctx.infer(feeds)
            torch.cuda.synchronize()
    except Exception as exc:  # the count is a report line, never a reason to fail a bench
        log.warning("could not count kernel launches: %s: %s", type(exc).__name__, exc)
        return None
    finally:
        ctx.close()
    kernels = [
        e
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and not any(word in e.name.lower() for word in _NOT_KERNELS)
    ]
    if not kernels:
        return None
    return len(kernels) / calls


def _on_host(inputs: Mapping[str, Any]) -> bool:
    import numpy as np

    return any(isinstance(v, np.ndarray) for v in inputs.values())


def describe_launches(engine: Any, inputs: Mapping[str, Any], cuda_graph: bool) -> str | None:
    """``'143 kernels per inference, replayed as 1 CUDA graph launch'``, or ``None`` where not counted."""
    count = count_kernel_launches(engine, inputs)
    if count is None:
        return None
    text = f"{count:.4g} kernels per inference"
    return text + (", replayed as 1 CUDA graph launch" if cuda_graph else f", {count:.4g} launches")
