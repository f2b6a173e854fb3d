"""The cyclic garbage collector set up for a real-time process: a server, a camera detector.

With torch, ONNX Runtime and a model loaded a process tracks ~180,000 objects, and a full collection walks all of
them with every thread stopped: 50-100 ms on the CI machine (``streamrt.profiling.gc_pauses`` measures it). Objects
that outlive a young collection (requests in flight, frames in a ring, per-frame records) are promoted, and with
Python's defaults (700, 10, 10) a full collection comes every ~0.5 s under server load
(docs/benchmarks/engine-request-path-cpu.md) and every few seconds at thousands of frames per second. A real-time
process collects the young generation every :data:`REALTIME_GC_THRESHOLDS` ``[0]`` allocations (request and frame
objects die by reference count first) and, once its models are loaded, moves what survives a collection to the
permanent generation (``gc.freeze``), so a full collection walks only what came later.

:func:`configure_collector` is called at a server process's start (``streamrt serve`` and its front-end
workers) and :func:`settle_heap` after each model load. A run that ends, ``streamrt detect``'s or a part of the
video check, takes the same settings for its duration with :func:`realtime_collector` and gives the process its
own back afterwards (the CLI is also called in-process, by tests and by users' scripts). Code embedded in a user's
program (``ServerThread``, ``run_detection`` as a library call) keeps the host process's settings: these are
process-wide choices.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator

__all__ = ["REALTIME_GC_THRESHOLDS", "configure_collector", "realtime_collector", "settle_heap"]

log = logging.getLogger(__name__)

REALTIME_GC_THRESHOLDS = (50_000, 20, 20)
"""``gc.set_threshold`` of a real-time process (Python's default: 700, 10, 10)."""

_configured = False


def configure_collector() -> None:
    """The collector's thresholds for a real-time process (see the module docstring)."""
    global _configured
    gc.set_threshold(*REALTIME_GC_THRESHOLDS)
    _configured = True


def settle_heap() -> None:
    """In a process set up by :func:`configure_collector`: collect the garbage, then freeze what is left (the loaded
    models, the libraries) out of every later collection. Elsewhere: nothing.

    What an earlier call froze is unfrozen first and collected with the rest: a model unloaded or
    replaced since then may have left reference cycles among frozen objects, which no collection
    would ever free otherwise (one full collection per load: ~0.1 s for ~180,000 objects)."""
    if not _configured:
        return
    start = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    log.debug("heap settled in %.0f ms: %d objects frozen", (time.perf_counter() - start) * 1e3,
              gc.get_freeze_count())


@contextlib.contextmanager
def realtime_collector() -> Iterator[None]:
    """A real-time process's collector for the block: the thresholds raised, the heap collected and frozen at the
    start (what is open by then: the detector, the sources); the thresholds restored and what was frozen here
    unfrozen at the end. A heap already frozen (a configured process) stays as it is."""
    thresholds = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0
    gc.set_threshold(*REALTIME_GC_THRESHOLDS)
    if freeze:
        gc.collect()
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()
        gc.set_threshold(*thresholds)
