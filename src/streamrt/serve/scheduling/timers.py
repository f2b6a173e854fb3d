"""Waking a scheduler at a clock reading: on time to a fraction of a millisecond, without spinning.

Event loops time their timers in whole milliseconds: uvloop (the default loop of ``streamrt
serve``) truncates a delay to milliseconds, so a timer set less than 1 ms ahead fires on the next
loop iteration, and a scheduler that re-checks ``time.monotonic()``, finds its batch not yet due and
sets the timer again spins until the moment has passed (measured: 16 scheduler passes and ~500 us
of CPU per batch with a 500 us batching delay); asyncio's own loop rounds its poll timeout up to the
millisecond instead, so a 500 us batching delay waits 1 ms or more there.

:func:`wake_at` gives waits of a millisecond or more to the loop (rounded up to the millisecond)
and shorter ones to one timer thread per process, which sleeps on a condition variable (the
kernel's timers: tens of microseconds late at most) and hands the callback to the loop with
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Cancellable", "wake_at"]

LOOP_TIMER_MIN_S = 1e-3
"""Waits at least this long go to the event loop's own timers."""


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class _Wakeup:
    """One wake-up; ``cancel`` on the loop thread stops it from running (and drops its loop timer)."""

    __slots__ = ("callback", "cancelled", "handle")

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback
        self.cancelled = False
        self.handle: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()

    def fire(self) -> None:  # on the loop thread
        if not self.cancelled:
            self.callback()


class _TimerThread:
    """One daemon thread that fires the short wake-ups of every event loop of the process."""

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):  # a forked child has no timer thread: start afresh there
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._due: list[tuple[float, int, asyncio.AbstractEventLoop, _Wakeup]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, loop: asyncio.AbstractEventLoop, when: float, wakeup: _Wakeup) -> None:
        with self._changed:
            heapq.heappush(self._due, (when, next(self._order), loop, wakeup))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="streamrt:timers", daemon=True)
                self._thread.start()
            self._changed.notify()

    def _run(self) -> None:
        with self._changed:
            while True:
                if not self._due:
                    self._changed.wait()
                    continue
                when, _, loop, wakeup = self._due[0]
                if wakeup.cancelled:
                    heapq.heappop(self._due)
                    continue
                left = when - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                heapq.heappop(self._due)
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                    loop.call_soon_threadsafe(wakeup.fire)


_TIMERS = _TimerThread()


def wake_at(loop: asyncio.AbstractEventLoop, when: float, callback: Callable[[], object]) -> Cancellable:
    """Call ``callback`` on ``loop`` (from the loop's thread) once ``time.monotonic()`` reaches
    ``when``: at once when it has passed, within tens of microseconds for waits under 1 ms, and
    up to 1 ms late for longer ones; never before."""
    wakeup = _Wakeup(callback)
    _arm(loop, when, wakeup)
    return wakeup


def _arm(loop: asyncio.AbstractEventLoop, when: float, wakeup: _Wakeup) -> None:
    delay = when - time.monotonic()
    if delay <= 0:
        loop.call_soon(wakeup.fire)
    elif delay < LOOP_TIMER_MIN_S:
        _TIMERS.add(loop, when, wakeup)
    else:
        wakeup.handle = loop.call_later(math.ceil(delay * 1e3) / 1e3, _recheck, loop, when, wakeup)


def _recheck(loop: asyncio.AbstractEventLoop, when: float, wakeup: _Wakeup) -> None:
    """The loop's timer fired; uvloop reads its clock in milliseconds cached per loop iteration, so
    it can fire a little before ``when``: then the rest is waited out (by the timer thread)."""
    wakeup.handle = None
    if not wakeup.cancelled:
        _arm(loop, when, wakeup)
