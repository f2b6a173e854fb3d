"""``GcPauses``: the collector's pauses inside a block, from any thread, and nothing after it."""

from __future__ import annotations

import gc
import threading

from streamrt.profiling.gc_pauses import GcPauses


def test_pauses_of_each_generation_from_any_thread_and_none_after_the_block() -> None:
    with GcPauses() as pauses:
        gc.collect(0)
        worker = threading.Thread(target=gc.collect)  # a full collection in another thread stops this one too
        worker.start()
        worker.join()
    gc.collect()
    assert pauses.count(0) >= 1 and pauses.count(2) == 1, pauses.pauses
    assert pauses.longest_ms(2) > 0 and all(seconds >= 0 for _, seconds in pauses.pauses)
    assert pauses.summary().startswith("full collections: 1 (longest ")
    # the young ones' longest pause is over both young generations (a 13 ms generation-0 pause on an H100 on
    # 2026-12-06 read "longest in generation 1: 0.0 ms")
    young = max(s for g, s in pauses.pauses if g < 2) * 1e3
    assert f"(longest {young:.1f} ms); " in pauses.summary()
    assert pauses._callback not in gc.callbacks


def test_a_block_without_collections_says_so() -> None:
    frozen = gc.isenabled()
    gc.disable()
    try:
        with GcPauses() as pauses:
            _ = [object() for _ in range(10)]
    finally:
        if frozen:
            gc.enable()
    assert pauses.pauses == [] and pauses.summary() == (
        "full collections: 0 (longest 0.0 ms); young ones: 0 (longest 0.0 ms); 0 ms paused in all")
