"""``realtime_collector``: a run's collector settings for the block only; a configured process's frozen heap kept."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_the_block_freezes_what_is_open_and_gives_the_process_its_settings_back() -> None:
    # in a fresh process: an earlier test in this one may have configured it (a decoder worker run in-process
    # freezes the heap for good, as a worker should)
    script = textwrap.dedent("""
        import gc
        from streamrt.pipeline.collector import REALTIME_GC_THRESHOLDS, realtime_collector
        before = gc.get_threshold()
        assert gc.get_freeze_count() == 0
        with realtime_collector():
            assert gc.get_threshold() == REALTIME_GC_THRESHOLDS and gc.get_freeze_count() > 0
        print(gc.get_threshold() == before and gc.get_freeze_count() == 0)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr


def test_a_heap_frozen_before_stays_frozen() -> None:
    script = textwrap.dedent("""
        import gc
        from streamrt.pipeline.collector import configure_collector, realtime_collector, settle_heap
        configure_collector()
        settle_heap()
        frozen = gc.get_freeze_count()
        with realtime_collector():
            pass
        print(frozen > 0 and gc.get_freeze_count() == frozen)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr
