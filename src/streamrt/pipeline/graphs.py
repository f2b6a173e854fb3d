"""CUDA-graph capture of static-shape stages, one graph per (slot, stage).

Replaying a graph costs one launch instead of one per kernel, which takes Python's launch cost
off the critical path of launch-bound stages (small models, many small kernels).

How (pytorch docs/source/notes/cuda.md, "CUDA Graphs"):

* warm up on a side (non-default) stream first: here the stage's own stream, which is never the
  default stream; lazy initialisation (cuDNN heuristics, allocator growth) must happen outside
  the capture;
* capture on that same stream (``torch.cuda.graph(g, stream=s)``), so an engine that enters
  ``torch.cuda.stream(stream.torch_stream)`` inside the stage stays on the capturing stream;
* replay on the stage's stream: ``CUDAGraph.replay()`` launches on the current stream.

One graph per slot, not per stage: each slot has its own buffers (static addresses differ), and
each capture gets a private memory pool, so replaying slot 1's graph cannot overwrite outputs
that a later stage is still reading from slot 0. Captures happen while the pipeline is built,
before any work is in flight, as capture requires (one capture at a time, nothing else running).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from streamrt.device.base import Stream
from streamrt.device.buffers import import_torch
from streamrt.errors import PipelineError

__all__ = ["capture_graph"]

logger = logging.getLogger(__name__)


def capture_graph(fn: Callable[[], None], stream: Stream, *, warmup: int = 2) -> Any:
    """Warm ``fn`` up on ``stream``, capture it into a ``torch.cuda.CUDAGraph`` and return it.

    Args:
        fn: enqueues the stage's work on the current stream; must not sync with the host.
        stream: a CUDA stream (its ``torch_stream`` is used for warm-up and capture).
        warmup: eager runs before capture.

    Raises:
        PipelineError: ``stream`` is not a CUDA stream, or capture failed (the message keeps
            torch's reason: a host sync, a data-dependent shape, an allocation...).
    """
    side = stream.torch_stream
    if not stream.is_cuda or side is None:
        raise PipelineError(f"cannot capture a CUDA graph on host stream '{stream.name}'")
    torch = import_torch()
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    side.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        # thread_local: host-stream worker threads of this or another pipeline may be alive;
        # they must not trip this capture (they do not touch this stream).
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            fn()
    except Exception as exc:
        raise PipelineError(f"CUDA graph capture on stream '{stream.name}' failed: {exc}") from exc
    return graph
