"""The dynamic batcher's policy: which queued requests form the next batch, and when.

:class:`BatchQueue` is pure bookkeeping (no threads, no clock of its own: every call takes
``now``), so its rules are tested deterministically; :mod:`streamrt.serve.scheduling.scheduler` drives it.
The rules are Triton's (``docs/user_guide/batcher.md``):

* Requests wait in priority levels (1 = highest), first come first served within a level.
* When an instance is free, the batch is formed from the head: compatible requests (same
  datatypes and same non-batch dims) in order, while the rows fit ``max_batch_size``.
* A full batch runs at once; so does the largest preferred size that can be formed.
* Otherwise the batch waits until ``max_queue_delay`` has passed since its *oldest* request
  (0: no wait), then runs as it is.
* ``max_queue_size`` rejects new requests at once when the queue is full; a request whose
  timeout passes while it is queued is taken out by :meth:`BatchQueue.expire`, on a timer,
  not only when an instance frees up.

Example:
    >>> from streamrt.serve.configs.config import BatchingConfig
    >>> q = BatchQueue(8, BatchingConfig(max_queue_delay_microseconds=1000))
    >>> q.push(Pending(None, rows=2, key=("x",), enqueued=0.0))
    >>> q.next_batch(now=0.0)           # not full: wait until 1 ms after the oldest request
    (None, 0.001)
    >>> batch, _ = q.next_batch(now=0.002); [p.rows for p in batch]
    [2]
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

from streamrt.errors import QueueFullError, RequestError
from streamrt.serve.configs.config import BatchingConfig

__all__ = ["BatchQueue", "Pending"]

_sequence = itertools.count()


@dataclass(eq=False)
class Pending:
    """A queued request as the batcher sees it.

    Attributes:
        payload: what the scheduler needs back (request and its future); opaque here.
        rows: batch rows the request brings (its first dim; 1 for models without batching).
        key: compatibility key; only requests with equal keys share a batch.
        enqueued: clock reading when queued (seconds).
        priority: level, 1 = highest (set by :meth:`BatchQueue.push`).
        deadline: clock reading after which it is rejected; None: no timeout.
    """

    payload: Any
    rows: int = 1
    key: Hashable = ()
    enqueued: float = 0.0
    priority: int = 1
    deadline: float | None = None
    seq: int = field(default_factory=lambda: next(_sequence))


class BatchQueue:
    """Priority queues of :class:`Pending` requests and the rule that cuts the next batch.

    Args:
        max_batch_size: largest number of rows in one execution (>= 1).
        batching: the dynamic batcher's settings; None: every request runs alone.
        is_dead: tells requests nobody waits for any more (cancelled); they are dropped.
    """

    def __init__(
        self,
        max_batch_size: int,
        batching: BatchingConfig | None,
        is_dead: Callable[[Pending], bool] | None = None,
    ) -> None:
        self.max_batch_size = max(1, max_batch_size)
        self.batching = batching
        self._is_dead = is_dead or (lambda _: False)
        levels = max(1, batching.priority_levels) if batching else 1
        self._levels: dict[int, collections.deque[Pending]] = {i: collections.deque() for i in range(1, levels + 1)}
        self._count = 0
        self._rows = 0  # rows of the queued requests
        self._timed = 0  # queued requests with a deadline
        if batching is not None:
            self._delay = batching.max_queue_delay_microseconds / 1e6
            self._preferred = frozenset(batching.preferred_batch_size)
            policy = batching.default_queue_policy
            self._max_queue = policy.max_queue_size
            self._timeout = policy.default_timeout_microseconds / 1e6
            self._override = policy.allow_timeout_override
            self._default_level = batching.default_priority_level or levels
        else:
            self._delay, self._preferred, self._max_queue, self._timeout = 0.0, frozenset(), 0, 0.0
            self._override, self._default_level = False, 1

    def __len__(self) -> int:
        return self._count

    def level_for(self, priority: int) -> int:
        """Queue level of a request's ``priority`` parameter (0: the default level)."""
        levels = len(self._levels)
        if priority == 0 or levels == 1:
            return self._default_level if priority == 0 else 1
        if priority > levels:
            raise RequestError(f"priority {priority} is out of range: the model has priority levels 1..{levels}")
        return priority

    def push(self, item: Pending, *, priority: int = 0, timeout_us: int = 0) -> None:
        """Queue ``item``; sets its level and deadline.

        Raises:
            QueueFullError: ``max_queue_size`` requests are already queued.
            RequestError: ``priority`` is outside the model's levels.
        """
        if self._max_queue and self._count >= self._max_queue:
            raise QueueFullError(
                f"the queue holds its maximum of {self._max_queue} requests; request rejected",
                hint="retry later, or raise dynamic_batching.default_queue_policy.max_queue_size",
            )
        item.priority = self.level_for(priority)
        timeout = timeout_us / 1e6 if (self._override and timeout_us > 0) else self._timeout
        item.deadline = item.enqueued + timeout if timeout > 0 else None
        self._levels[item.priority].append(item)
        self._count += 1
        self._rows += item.rows
        self._timed += item.deadline is not None

    def _ordered(self) -> Iterator[Pending]:
        for queue in self._levels.values():
            yield from queue

    def _remove(self, items: list[Pending]) -> None:
        gone = {id(i) for i in items}
        for level, queue in self._levels.items():
            if any(id(i) in gone for i in queue):
                self._levels[level] = collections.deque(i for i in queue if id(i) not in gone)
        self._count -= len(gone)
        self._rows -= sum(i.rows for i in items)
        self._timed -= sum(i.deadline is not None for i in items)

    def waiting_until(self, now: float) -> float | None:
        """When nothing queued can run or expire before some time: that time (the batching delay's
        end for the oldest request), without looking at each request; None when a full pass is needed.

        A request joining a batch that waits for its delay changes nothing (no preferred sizes, fewer
        rows than the maximum, no request deadlines), so the scheduler skips the pass it would cost:
        with ~8 requests per batch, passes that each walked the whole queue three times."""
        if not self._count or self._timed or self._preferred or self._delay <= 0 or self._rows >= self.max_batch_size:
            return None
        wake = min(q[0].enqueued for q in self._levels.values() if q) + self._delay
        return wake if now < wake else None

    def expire(self, now: float) -> list[Pending]:
        """Take out and return requests past their deadline, and requests nobody waits for."""
        out = [p for p in self._ordered() if (p.deadline is not None and now >= p.deadline) or self._is_dead(p)]
        if out:
            self._remove(out)
        return [p for p in out if not self._is_dead(p)]

    def next_deadline(self) -> float | None:
        """The earliest deadline of a queued request (the scheduler wakes up then)."""
        deadlines = [p.deadline for p in self._ordered() if p.deadline is not None]
        return min(deadlines) if deadlines else None

    def next_batch(self, now: float) -> tuple[list[Pending] | None, float | None]:
        """Cut the next batch, if it is due.

        Returns:
            ``(batch, None)`` to run now (the requests are taken out of the queue);
            ``(None, when)`` when the batch waits for more requests until ``when`` at the latest;
            ``(None, None)`` when the queue is empty.
        """
        head = next(iter(self._ordered()), None)
        if head is None:
            return None, None
        if self.batching is None:
            self._remove([head])
            return [head], None
        chosen: list[Pending] = []
        rows = 0
        for item in self._ordered():
            if item.key != head.key:
                continue
            if rows + item.rows > self.max_batch_size:
                break
            chosen.append(item)
            rows += item.rows
            if rows == self.max_batch_size:
                break
        if rows < self.max_batch_size and self._preferred:
            running = list(itertools.accumulate(p.rows for p in chosen))
            best = max((i for i, r in enumerate(running) if r in self._preferred), default=None)
            if best is not None:
                chosen = chosen[: best + 1]
                rows = running[best]
        due = rows >= self.max_batch_size or rows in self._preferred or self._delay <= 0
        if not due:
            wake = min(p.enqueued for p in chosen) + self._delay
            if now < wake:
                return None, wake
        self._remove(chosen)
        return chosen, None

    def drain(self) -> list[Pending]:
        """Take out every queued request (shutdown, unload)."""
        items = list(self._ordered())
        for queue in self._levels.values():
            queue.clear()
        self._count = self._rows = self._timed = 0
        return items
