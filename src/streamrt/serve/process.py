"""Process-wide settings of a serving process (the engine process and each front-end worker).

Three defaults cost a server under load, two of CPython's and one of glibc's, all measured on the 2-core CI
machine:

* The GIL switch interval (5 ms): the event loop thread parses request bodies while instance
  threads need the GIL for the few Python steps of each batch, and at 5 ms a waiting instance
  thread lost up to 5 ms per step (HTTP 4.8 MB requests: batch gather 47 ms -> 1.1 ms, gRPC p99
  419 -> 192 ms; docs/benchmarks/serving-frontend-cpu.md). A serving process uses 0.5 ms.
* The cyclic garbage collector: full collections of every object of the process every ~0.5 s
  under load, ~100 ms each with every thread stopped; a serving process sets it up as every
  real-time process does (:mod:`streamrt.pipeline.collector`: thresholds, the heap frozen after
  each model load).
* glibc's malloc gives memory back to the kernel as soon as a few MB lie free at the top of a heap,
  and h2corn's Tokio threads allocate each request body in heaps of their own: every 4.8 MB gRPC
  request then touched fresh pages (~2,700 page faults per request; a 4.8 MB ``bytearray`` took
  2.5 ms to allocate on the CI machine instead of 0.3 ms to fill). A serving process keeps up to
  :data:`MALLOC_TRIM_THRESHOLD` free per heap and serves blocks below :data:`MALLOC_MMAP_THRESHOLD`
  from its heaps (``mallopt``): binary 4.8 MB requests through ``--grpc-server h2corn`` took 4.2-5.7 ms
  at p50 at concurrency 1 instead of 11.2-12.4, and 1.6x the images/s at concurrency 4, with the
  same resident memory (docs/benchmarks/2026-12-06-malloc-cpu.md). A process started with glibc's own
  malloc settings (``MALLOC_*_`` variables, ``GLIBC_TUNABLES``), another allocator preloaded or
  ``STREAMRT_MALLOC_TUNING=0`` keeps glibc's behaviour; a C library without ``mallopt`` is left alone.

:func:`configure_serving_process` is called by ``streamrt serve`` and by each front-end worker at
start; :func:`settle_heap` (:func:`streamrt.pipeline.collector.settle_heap`) after each model load.
Embedded servers (``ServerThread`` in a user's process, the tests) keep the host process's settings:
these are process-wide choices.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

from streamrt._env import env_switch
from streamrt.pipeline.collector import REALTIME_GC_THRESHOLDS, configure_collector, settle_heap

__all__ = ["GC_THRESHOLDS", "MALLOC_MMAP_THRESHOLD", "MALLOC_TRIM_THRESHOLD", "MALLOC_TUNING_ENV", "SWITCH_INTERVAL_S",
           "configure_serving_process", "keep_freed_memory", "settle_heap"]

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.0005
"""GIL switch interval of a serving process (Python's default: 5 ms)."""

GC_THRESHOLDS = REALTIME_GC_THRESHOLDS
"""``gc.set_threshold`` of a serving process (Python's default: 700, 10, 10)."""

MALLOC_MMAP_THRESHOLD = 32 << 20
"""Blocks at least this large get memory of their own from the kernel (glibc's largest setting on 64-bit;
its default starts at 128 KiB and follows the largest block freed)."""

MALLOC_TRIM_THRESHOLD = 256 << 20
"""Free memory a heap keeps before it gives some back to the kernel (glibc's default: twice the mmap threshold)."""

MALLOC_TUNING_ENV = "STREAMRT_MALLOC_TUNING"
"""``0``: a serving process leaves malloc's thresholds as glibc sets them."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
_OWN_MALLOC_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX",
                        "GLIBC_TUNABLES", "LD_PRELOAD")


def keep_freed_memory() -> str:
    """Set glibc's mmap and trim thresholds for a serving process (see the module docstring); what was done,
    for the log."""
    if not env_switch(MALLOC_TUNING_ENV, True):
        return f"malloc left as glibc sets it ({MALLOC_TUNING_ENV}=0)"
    own = [name for name in _OWN_MALLOC_SETTINGS if os.environ.get(name)]
    if own:
        return f"malloc left as configured ({', '.join(own)})"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "malloc left alone (no mallopt in this C library)"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    refused = [name for name, option, value in (("mmap", _M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD),
                                                ("trim", _M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD))
               if mallopt(option, value) != 1]
    if refused:
        return f"malloc thresholds not all set (mallopt refused the {' and '.join(refused)} threshold)"
    return (f"malloc keeps up to {MALLOC_TRIM_THRESHOLD >> 20} MiB free per heap "
            f"(blocks under {MALLOC_MMAP_THRESHOLD >> 20} MiB)")


def configure_serving_process() -> None:
    """Switch interval, collector thresholds and malloc thresholds for serving (see the module docstring)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    configure_collector()
    log.debug(keep_freed_memory())
