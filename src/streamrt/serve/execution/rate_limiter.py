"""The server's rate limiter: which model instance may execute next, across all loaded models.

Triton's rate limiter (``docs/user_guide/rate_limiter.md``, ``core/src/rate_limiter.cc``), with
its rules kept:

* Off by default (``--rate-limit off``): instances execute as soon as they have a batch. With
  ``--rate-limit execution_count`` every instance must be *granted* before each execution.
* An instance group's ``rate_limiter.resources`` are held while one of its instances executes
  and returned when it finishes. A resource is per device unless ``global``; a name may not be
  both. The copies available are, by default, the largest count any registered instance asks
  for (so every instance can run); ``--rate-limit-resource NAME:COUNT[:DEVICE]`` sets them
  instead, and then every resource a model uses must be given, with at least the count it asks
  for, or the model is refused at load (Triton's ``Resource count for "R" is limited to ...``).
* Instances that wait are granted in order of ``executions * max(priority, 1)``, lowest first
  (ties: first come, first served). So an instance of ``priority: 2`` gets half the executions
  of one of ``priority: 1`` while both wait: lower value, more often. The order is strict: when
  the first waiting instance does not fit, the ones behind it wait too (no bypass), which is what
  lets a higher-priority model take the GPU back from a busy lower-priority one.
* Every instance takes part in that order while the limiter is on, with or without resources.

Unlike Triton, every grant that fits is made as soon as resources free up (Triton allocates at
most one per event). Instances register at load (:meth:`RateLimiter.register`, which is where a
resource conflict refuses the model) and hold a :class:`Ticket`; the scheduler calls
:meth:`Ticket.stage` with a callback that runs the batch, and :meth:`Ticket.release` when it
finished (with ``then=`` when the instance has its next batch ready: it waits again in the same
step, as Triton's instances do). :meth:`Ticket.acquire` is the blocking form for plain threads.

Example:
    >>> from streamrt.serve.configs.config import RateLimiterConfig, parse_rate_limit_resource, RateLimiterResource
    >>> limiter = RateLimiter(["gpu_slots:1"])
    >>> a = limiter.register("a_0", RateLimiterConfig((RateLimiterResource("gpu_slots", 1),), priority=1))
    >>> a.acquire(timeout=1.0), limiter.available("gpu_slots")
    (True, 0)
    >>> a.release(); limiter.available("gpu_slots")
    1
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from streamrt.errors import ConfigError
from streamrt.serve.configs.config import RateLimiterConfig, parse_rate_limit_resource

__all__ = ["GLOBAL", "RateLimiter", "Ticket"]

log = logging.getLogger(__name__)

GLOBAL = "global"
"""The pool key of global resources (device pools are keyed by the device index)."""

Pool = int | str  # a device index, or GLOBAL


@dataclass(frozen=True)
class _Explicit:
    name: str
    count: int
    device: int | None


class Ticket:
    """One instance's place in the rate limiter: its needs, its priority and its executions."""

    def __init__(self, limiter: RateLimiter, name: str, priority: int, needs: dict[tuple[Pool, str], int]) -> None:
        self.name = name
        self.priority = max(priority, 1)
        self.needs = needs
        self.executions = 0
        self._limiter = limiter
        self._on_grant: Callable[[], None] | None = None
        self.held = False

    def __repr__(self) -> str:
        return f"Ticket({self.name!r}, priority={self.priority}, executions={self.executions})"

    @property
    def scaled_priority(self) -> int:
        """Triton's ``ScaledPriority``: executions so far times the priority weight (lowest goes first)."""
        return self.executions * self.priority

    def stage(self, on_grant: Callable[[], None]) -> None:
        """Wait for a grant; ``on_grant`` runs once, in this thread if granted at once, else in the
        thread that releases the resources (keep it short: hand the work to another thread)."""
        self._limiter._stage(self, on_grant)

    def on_loop(self, loop: asyncio.AbstractEventLoop, launch: Callable[..., object], *args: Any
                ) -> Callable[[], None]:
        """An ``on_grant`` for :meth:`stage` / :meth:`release` that runs ``launch(*args)`` on ``loop``'s
        thread (a grant comes from whichever thread released the resources); when the loop is
        closed nothing will run, so the resources go back at once."""

        def granted() -> None:
            try:
                loop.call_soon_threadsafe(launch, *args)
            except RuntimeError:
                self.release()

        return granted

    def acquire(self, timeout: float | None = None) -> bool:
        """Block until granted (True) or ``timeout`` seconds passed (False, no longer waiting)."""
        granted = threading.Event()
        self.stage(granted.set)
        if granted.wait(timeout):
            return True
        return not self._limiter._cancel(self)  # not cancelled: granted between the timeout and the cancel

    def release(self, then: Callable[[], None] | None = None) -> None:
        """Return the resources after an execution, count the execution, and grant whoever fits next.

        ``then``: the instance has more work; it waits for its next grant in the same step, with its
        new execution count (Triton's ``OnRelease`` stages an instance with pending requests before
        allocating), so a released instance competes by priority instead of always yielding.
        """
        self._limiter._release(self, then)

    def close(self) -> None:
        """Leave the limiter (the instance is closed): stop waiting, return anything held."""
        self._limiter._unregister(self)


class RateLimiter:
    """Resources and priorities of every registered instance, shared by all models of a server.

    Args:
        explicit: ``--rate-limit-resource`` values (``NAME:COUNT[:DEVICE]``); empty: each resource
            has the largest count any registered instance asks for.
    """

    def __init__(self, explicit: Iterable[str] = ()) -> None:
        self._explicit = [_Explicit(*parse_rate_limit_resource(s)) for s in explicit]
        self._lock = threading.Lock()
        self._tickets: dict[int, Ticket] = {}
        self._limits: dict[tuple[Pool, str], int] = {}
        self._allocated: Counter[tuple[Pool, str]] = Counter()
        self._staged: list[tuple[int, int, Ticket]] = []
        self._order = itertools.count()

    # --- registration -------------------------------------------------------------------------

    def register(self, name: str, config: RateLimiterConfig | None, device: int = 0) -> Ticket:
        """Add an instance running on ``device`` (CPU instances count as device 0, as in Triton).

        Raises:
            ConfigError: a resource is both global and per device, or ``--rate-limit-resource``
                gives fewer copies than the instance asks for (or none).
        """
        config = config or RateLimiterConfig()
        needs = {(GLOBAL if r.is_global else device, r.name): r.count for r in config.resources}
        ticket = Ticket(self, name, config.priority, needs)
        with self._lock:
            self._tickets[id(ticket)] = ticket
            try:
                self._limits = self._compute_limits()
            except ConfigError:
                del self._tickets[id(ticket)]
                raise
        log.debug("rate limiter: %s registered (priority %d, needs %s); limits %s", name, ticket.priority,
                  needs, self._limits)
        return ticket

    def _unregister(self, ticket: Ticket) -> None:
        callbacks: list[Callable[[], None]] = []
        with self._lock:
            if self._tickets.pop(id(ticket), None) is None:
                return
            self._remove_staged(ticket)
            if ticket.held:
                self._give_back(ticket)
            self._limits = self._compute_limits()
            callbacks = self._grant_locked()
        _run(callbacks)

    def _compute_limits(self) -> dict[tuple[Pool, str], int]:
        """Triton's ``UpdateResourceLimits``: the largest count asked per (pool, name), checked against
        the explicit counts when there are any."""
        wanted: dict[tuple[Pool, str], int] = {}
        for ticket in self._tickets.values():
            for key, count in ticket.needs.items():
                wanted[key] = max(wanted.get(key, 0), count)
        global_names = {name for pool, name in wanted if pool == GLOBAL}
        both = sorted(name for pool, name in wanted if pool != GLOBAL and name in global_names)
        if both:
            raise ConfigError(f'rate limiter resource "{both[0]}" is present as both global and device-specific '
                              "resource in the model configuration",
                              hint="give the resource the same 'global' setting in every model")
        if not self._explicit:
            return wanted
        limits = {}
        for (pool, name), needed in wanted.items():
            given = [e.count for e in self._explicit if e.name == name and
                     (pool == GLOBAL or e.device is None or e.device == pool)]
            count = max(given, default=0)
            if count < needed:
                raise ConfigError(
                    f'rate limiter resource count for "{name}" is limited to {count} which will prevent scheduling '
                    f"of one or more model instances, the minimum required count is {needed}",
                    hint=f"--rate-limit-resource {name}:{needed}",
                )
            limits[(pool, name)] = count
        return limits

    # --- grants -------------------------------------------------------------------------------

    def _fits(self, ticket: Ticket) -> bool:
        return all(self._allocated[key] + count <= self._limits.get(key, 0) for key, count in ticket.needs.items())

    def _grant_locked(self) -> list[Callable[[], None]]:
        """Grant from the head of the priority order while the head fits (strict order: no bypass)."""
        granted = []
        while self._staged:
            _, _, ticket = self._staged[0]
            if not self._fits(ticket):
                break
            heapq.heappop(self._staged)
            for key, count in ticket.needs.items():
                self._allocated[key] += count
            ticket.held = True
            assert ticket._on_grant is not None
            granted.append(ticket._on_grant)
            ticket._on_grant = None
        return granted

    def _stage(self, ticket: Ticket, on_grant: Callable[[], None]) -> None:
        with self._lock:
            if id(ticket) not in self._tickets:
                raise ConfigError(f"rate limiter: instance {ticket.name} is not registered (it was closed)")
            if ticket.held or ticket._on_grant is not None:
                raise RuntimeError(f"rate limiter: {ticket.name} is already waiting or executing")
            ticket._on_grant = on_grant
            heapq.heappush(self._staged, (ticket.scaled_priority, next(self._order), ticket))
            callbacks = self._grant_locked()
        _run(callbacks)

    def _give_back(self, ticket: Ticket) -> None:
        for key, count in ticket.needs.items():
            self._allocated[key] -= count
        ticket.held = False

    def _release(self, ticket: Ticket, then: Callable[[], None] | None) -> None:
        with self._lock:
            if id(ticket) not in self._tickets:
                return  # closed while executing: unregistering gave everything back
            if not ticket.held:
                raise RuntimeError(f"rate limiter: {ticket.name} released resources it does not hold")
            self._give_back(ticket)
            ticket.executions += 1
            if then is not None:
                ticket._on_grant = then
                heapq.heappush(self._staged, (ticket.scaled_priority, next(self._order), ticket))
            callbacks = self._grant_locked()
        _run(callbacks)

    def _remove_staged(self, ticket: Ticket) -> bool:
        kept = [entry for entry in self._staged if entry[2] is not ticket]
        if len(kept) == len(self._staged):
            return False
        heapq.heapify(kept)
        self._staged = kept
        ticket._on_grant = None
        return True

    def _cancel(self, ticket: Ticket) -> bool:
        with self._lock:
            removed = self._remove_staged(ticket)
            callbacks = self._grant_locked() if removed else []
        _run(callbacks)
        return removed

    # --- introspection (tests, logs) ----------------------------------------------------------

    def available(self, name: str, pool: Pool = 0) -> int:
        """Copies of resource ``name`` in ``pool`` (a device index, or :data:`GLOBAL`) not held now."""
        with self._lock:
            key: tuple[Pool, str] = (pool, name)
            if name in {n for p, n in self._limits if p == GLOBAL}:
                key = (GLOBAL, name)
            return self._limits.get(key, 0) - self._allocated[key]

    @property
    def waiting(self) -> int:
        """Instances staged and not yet granted."""
        with self._lock:
            return len(self._staged)


def _run(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        callback()
