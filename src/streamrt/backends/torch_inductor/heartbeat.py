"""A word every few seconds during a long silent step (an AOTInductor compile), with the time so far.

Compiling kernels gives no progress of its own: on a 2-core CPU machine one profile took about
80 s without a line, which reads as a hang. :func:`with_heartbeat` runs the step and, from a
daemon thread, sends ``"<what>: still working, 24 s so far"`` to the build's progress callback
every ``every_s`` seconds, then one ``"<what>: done in 81 s"`` if it beat at least once (a short
step stays one line).

Example:
    >>> import time
    >>> lines = []
    >>> with_heartbeat(lambda: time.sleep(0.05) or 7, lines.append, "compiling", every_s=0.02)
    7
    >>> lines[0].startswith("compiling: still working")
    True
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["HEARTBEAT_S", "with_heartbeat"]

T = TypeVar("T")

HEARTBEAT_S = 12.0
"""Seconds between heartbeat lines: often enough to show life, rare enough not to flood a log."""


def with_heartbeat(step: Callable[[], T], progress: Callable[[str], None], what: str, *,
                   every_s: float | None = None) -> T:
    """Run ``step()`` and return its result; while it runs, say ``what`` and the time so far every ``every_s``.

    ``every_s`` defaults to :data:`HEARTBEAT_S`, read at each call. The step runs on the calling
    thread (torch's compile state is per thread); only the heartbeat runs on another. An exception
    from the step propagates after the heartbeat has stopped.
    """
    every_s = HEARTBEAT_S if every_s is None else every_s
    start = time.monotonic()
    stop = threading.Event()
    beats = 0

    def beat() -> None:
        nonlocal beats
        while not stop.wait(every_s):
            beats += 1
            progress(f"{what}: still working, {time.monotonic() - start:.0f} s so far")

    thread = threading.Thread(target=beat, name="streamrt:build-heartbeat", daemon=True)
    thread.start()
    try:
        result = step()
    finally:
        stop.set()
        thread.join()
    if beats:
        progress(f"{what}: done in {time.monotonic() - start:.0f} s")
    return result
