"""Waking a scheduler at a clock reading: on time to a fraction of a millisecond, without spinning.

Event loops time their timers in whole milliseconds: uvloop (the default loop of ``streamrt
serve``) truncates a delay to milliseconds, so a timer set less than 1 ms ahead fires on the next
loop iteration, and a scheduler that re-checks ``time.monotonic()``, finds its batch not yet due and
sets the timer again spins until the moment has passed (measured: 16 scheduler passes and ~500 us
of CPU per batch with a 500 us batching delay); asyncio's own loop rounds its poll timeout up to the
millisecond instead, so a 500 us batching delay waits 1 ms or more there.

:func:`wake_at` gives waits of a millisecond or more to the loop (rounded up to the millisecond)
and shorter ones to the kernel's high-resolution timers. On Linux that is one ``timerfd`` per
event loop, which the loop watches like a socket: the callback runs from the loop's own poll, tens
of microseconds late at most, with no thread involved. Elsewhere (or where the timerfd cannot be
created) one timer thread per process sleeps on a condition variable and hands the callback to the
loop with ``call_soon_threadsafe``. The thread cost the 2-core CPU machine ~10 us of CPU per 64 B
gRPC request at ~8 requests per batch (its own wake-ups and the GIL hand-overs they need).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import itertools
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = ["Cancellable", "wake_at"]

LOOP_TIMER_MIN_S = 1e-3
"""Waits at least this long go to the event loop's own timers."""

log = logging.getLogger(__name__)


class Cancellable(Protocol):
    def cancel(self) -> None: ...

    @property
    def pending(self) -> bool:
        """Neither fired nor cancelled yet."""


class _Wakeup:
    """One wake-up; ``cancel`` on the loop thread stops it from running (and drops its loop timer)."""

    __slots__ = ("callback", "cancelled", "fired", "handle")

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback
        self.cancelled = False
        self.fired = False
        self.handle: asyncio.TimerHandle | None = None

    @property
    def pending(self) -> bool:
        return not (self.cancelled or self.fired)

    def cancel(self) -> None:
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()

    def fire(self) -> None:  # on the loop thread
        if not self.cancelled:
            self.fired = True
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
            if self._due[0][3] is wakeup:  # a later one: the thread wakes for the head first anyway
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


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_CLOCK_MONOTONIC = 1  # the clock of time.monotonic() on Linux
_TFD_NONBLOCK, _TFD_CLOEXEC, _TFD_TIMER_ABSTIME = os.O_NONBLOCK, 0o2000000, 1


class _LoopTimer:
    """A Linux ``timerfd`` watched by one event loop: the short wake-ups of that loop, fired from its
    own poll (no thread, no GIL hand-over). The fd is set for the earliest pending wake-up only."""

    def __init__(self, loop: asyncio.AbstractEventLoop, libc: ctypes.CDLL) -> None:
        self._settime = libc.timerfd_settime
        self._fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._due: list[tuple[float, int, _Wakeup]] = []
        self._order = itertools.count()
        self._set_for = math.inf  # the reading the fd is set for (inf: not set)
        self._spec = _Itimerspec()
        try:
            loop.add_reader(self._fd, self._fire)
        except BaseException:
            os.close(self._fd)
            raise
        weakref.finalize(loop, os.close, self._fd)

    def add(self, when: float, wakeup: _Wakeup) -> None:
        heapq.heappush(self._due, (when, next(self._order), wakeup))
        if when < self._set_for:
            self._set(when)

    def _set(self, when: float) -> None:
        self._set_for = when
        value = self._spec.it_value
        if math.isinf(when):
            value.tv_sec = value.tv_nsec = 0  # disarm
        else:
            seconds = math.floor(when)
            value.tv_sec, value.tv_nsec = seconds, max(1, int((when - seconds) * 1e9))  # 0 would disarm
        if self._settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def _fire(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a wake-up re-armed before the loop read the fd
            os.read(self._fd, 8)
        now = time.monotonic()
        ready = []
        while self._due and (self._due[0][0] <= now or self._due[0][2].cancelled):
            ready.append(heapq.heappop(self._due)[2])
        self._set(self._due[0][0] if self._due else math.inf)  # the head is pending now
        for wakeup in ready:
            wakeup.fire()


_LOOP_TIMERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopTimer | None] = weakref.WeakKeyDictionary()


def _loop_timer(loop: asyncio.AbstractEventLoop) -> _LoopTimer | None:
    """The loop's timerfd (created on first use); None where there is none (not Linux, or it failed:
    the timer thread serves that loop)."""
    try:
        return _LOOP_TIMERS[loop]
    except KeyError:
        pass
    timer = None
    if sys.platform.startswith("linux"):
        try:
            timer = _LoopTimer(loop, ctypes.CDLL(None, use_errno=True))
        except (OSError, AttributeError, NotImplementedError, RuntimeError) as exc:
            log.debug("no timerfd for the event loop (%s); short wake-ups go to the timer thread", exc)
    _LOOP_TIMERS[loop] = timer
    return timer


if hasattr(os, "register_at_fork"):  # a forked child's loops are its own; the parent's fds stay the parent's
    os.register_at_fork(after_in_child=_LOOP_TIMERS.clear)


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
        timer = _loop_timer(loop)
        if timer is not None:
            timer.add(when, wakeup)
        else:
            _TIMERS.add(loop, when, wakeup)
    else:
        wakeup.handle = loop.call_later(math.ceil(delay * 1e3) / 1e3, _recheck, loop, when, wakeup)


def _recheck(loop: asyncio.AbstractEventLoop, when: float, wakeup: _Wakeup) -> None:
    """The loop's timer fired; uvloop reads its clock in milliseconds cached per loop iteration, so
    it can fire a little before ``when``: then the rest is waited out (by the timer thread)."""
    wakeup.handle = None
    if not wakeup.cancelled:
        _arm(loop, when, wakeup)
