"""Process-wide settings of a serving process (the engine process and each front-end worker).

Two CPython defaults cost a server under load, both measured on the 2-core CI machine:

* The GIL switch interval (5 ms): the event loop thread parses request bodies while instance
  threads need the GIL for the few Python steps of each batch, and at 5 ms a waiting instance
  thread lost up to 5 ms per step (HTTP 4.8 MB requests: batch gather 47 ms -> 1.1 ms, gRPC p99
  419 -> 192 ms; docs/benchmarks/serving-frontend-cpu.md). A serving process uses 0.5 ms.
* The cyclic garbage collector: requests in flight outlive the young collections (700
  allocations), get promoted, and trigger a full collection every ~0.5 s under load; each one walks
  every object of the process (ONNX Runtime, torch, the models: ~180,000 objects), about 100 ms
  with the event loop and every instance thread stopped. A serving process collects the young
  generation every :data:`GC_THRESHOLDS` ``[0]`` allocations (request objects die by reference
  count first) and, once its models are loaded, moves what survives a collection to the permanent
  generation (``gc.freeze``), so a full collection walks only what came later
  (docs/benchmarks/engine-request-path-cpu.md).

:func:`configure_serving_process` is called by ``streamrt serve`` and by each front-end worker at
start; :func:`settle_heap` after each model load. Embedded servers (``ServerThread`` in a user's
process, the tests) keep the host process's settings: these are process-wide choices.
"""

from __future__ import annotations

import gc
import logging
import sys
import time

__all__ = ["GC_THRESHOLDS", "SWITCH_INTERVAL_S", "configure_serving_process", "settle_heap"]

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.0005
"""GIL switch interval of a serving process (Python's default: 5 ms)."""

GC_THRESHOLDS = (50_000, 20, 20)
"""``gc.set_threshold`` of a serving process (Python's default: 700, 10, 10)."""

_configured = False


def configure_serving_process() -> None:
    """Switch interval and collector thresholds for serving (see the module docstring)."""
    global _configured
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.set_threshold(*GC_THRESHOLDS)
    _configured = True


def settle_heap() -> None:
    """In a configured serving process: collect the garbage, then freeze what is left (the loaded
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
