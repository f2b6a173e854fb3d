"""Futures whose waiters resume the moment their result is set: the requests of a finished batch are answered
before the loop turns to anything else.

asyncio runs a future's done callbacks (a waiting task's wake-up among them) through ``call_soon``, after
everything already queued on the loop. When a batch completes, what is queued there is often the next requests,
which the front end (h2corn) hands over in groups, each ~50 us of parsing and admission before the finished
batch's answers can go out. Measured on the 2-core CPU machine (64 B gRPC requests through h2corn, concurrency
16, the null Python model): 146-166 us (p50) from a batch's completion to its first reply, 33 us with the
wake-ups run at once, and 1-5% more requests/s in each of 4 interleaved rounds
(docs/benchmarks/2026-12-05-grpc-latency-split-cpu.md).

:func:`eager_future` makes a future that, when its result is set from a plain loop callback (the scheduler's
completion of a batch), runs its done callbacks right there; set from inside a task (where asyncio does not
allow another task's step to run), cancelled, or failed, it schedules them as asyncio does. asyncio has no hook
for this: the future is asyncio's pure-Python ``Future`` with its private callback scheduling replaced; where
that class or method is missing (another Python), :func:`eager_future` returns the loop's own future, and
:data:`EAGER` says so.
"""

from __future__ import annotations

import asyncio
import asyncio.futures
from typing import Any

__all__ = ["EAGER", "eager_future"]

_BASE: Any = getattr(asyncio.futures, "_PyFuture", None)
_SCHEDULE = "_Future__schedule_callbacks"  # Future.__schedule_callbacks, name-mangled

EAGER = _BASE is not None and callable(getattr(_BASE, _SCHEDULE, None))
"""Whether this Python's asyncio lets :func:`eager_future` run callbacks at once (else: the loop's futures)."""


if EAGER:
    _deferred = getattr(_BASE, _SCHEDULE)

    class _EagerFuture(_BASE):
        """asyncio's Python ``Future`` whose successful result wakes its waiters inline (see the module)."""

        def _Future__schedule_callbacks(self) -> None:  # the name asyncio's Future calls
            loop = self._loop
            if self.cancelled() or self._exception is not None or asyncio.current_task(loop) is not None:
                _deferred(self)
                return
            callbacks = self._callbacks[:]
            self._callbacks[:] = []
            for callback, context in callbacks:
                try:
                    context.run(callback, self)
                except Exception as exc:  # what call_soon would have done with it
                    loop.call_exception_handler({"message": "Exception in an eager future's callback",
                                                 "exception": exc, "future": self})


def eager_future(loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
    """A future on ``loop`` whose result, set from a plain callback, resumes its waiters at once."""
    if EAGER:
        future: asyncio.Future[Any] = _EagerFuture(loop=loop)
        return future
    return loop.create_future()
