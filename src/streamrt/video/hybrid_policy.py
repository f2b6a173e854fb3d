"""Which decoder takes which stream: NVDEC first, CPU decoders when NVDEC is full, and back again.

Pure logic, no decoders and no threads: :class:`HybridPolicy` is given each decoder pool's
capacity (decoded frames per second, measured) and each stream's demand (its frame rate), and
answers with an assignment; fed measurements while streams run, it answers with moves. The
clock is injected, so the tests drive it (``serve/scheduling/batcher.py`` does the same with its deadlines).

Rules, in order of preference:

1. **Assign** streams to NVDEC while its load stays within ``headroom`` x its capacity (hardware
   decode leaves the CPU to the rest of the pipeline), then to the CPU pool the same way; what
   fits nowhere goes to the pool with the most room left, and the plan says it is over capacity.
2. **Measure**: a pool whose streams starve (the consumer waited for frames) is saturated, so its
   capacity *is* the rate it decodes at now; a pool that keeps up can do at least what it does.
3. **Spill**: a pool over ``headroom`` x capacity moves streams (last assigned first) to the other
   pool while that one has room. **Return**: when NVDEC has room again, CPU streams move back.
   Moves wait ``hold_s`` after the previous ones (measurements settle; no flapping).

Example:
    >>> policy = HybridPolicy({"nvdec": 100.0, "cpu": 60.0}, headroom=1.0)
    >>> policy.assign([30.0] * 4)
    ['nvdec', 'nvdec', 'nvdec', 'cpu']
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from streamrt.errors import ConfigError

__all__ = ["DEFAULT_HEADROOM", "PREFERENCE", "HybridPolicy", "Move"]

DEFAULT_HEADROOM = 0.85
"""The fraction of a pool's capacity a policy plans up to by default (queues need slack; ``streamrt detect
--hybrid``'s default ``--headroom``)."""

# Preferred first.
PREFERENCE = ("nvdec", "cpu")


@dataclass(frozen=True)
class Move:
    """Stream ``stream`` goes from pool ``src`` to pool ``dst``."""

    stream: int
    src: str
    dst: str


class HybridPolicy:
    """Assignment and re-balancing of streams over decoder pools (see the module docstring).

    Args:
        capacity: frames/s each pool decodes at most (``nvdec`` and/or ``cpu``; 0 or absent: no such pool).
        headroom: the fraction of a pool's capacity to plan up to (queues need slack).
        hold_s: seconds between rounds of moves.
        clock: monotonic seconds (injected by tests).
    """

    def __init__(self, capacity: dict[str, float], *, headroom: float = DEFAULT_HEADROOM, hold_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        unknown = set(capacity) - set(PREFERENCE)
        if unknown:
            raise ConfigError(f"decoder pools are {', '.join(PREFERENCE)}, got {sorted(unknown)}")
        if not 0 < headroom <= 1:
            raise ConfigError(f"headroom must be in (0, 1], got {headroom}")
        self.capacity = {name: max(0.0, float(capacity.get(name, 0.0))) for name in PREFERENCE}
        if not any(self.capacity.values()):
            raise ConfigError("hybrid decoding needs at least one decoder pool with capacity > 0")
        self.headroom = headroom
        self.hold_s = hold_s
        self._clock = clock
        self._last_moves = -float("inf")
        self.moves: list[Move] = []

    def _pools(self) -> list[str]:
        return [name for name in PREFERENCE if self.capacity[name] > 0]

    def _room(self, name: str, load: float) -> float:
        return self.headroom * self.capacity[name] - load

    def fitting(self, name: str, demands: Sequence[float]) -> int:
        """How many of ``demands``, taken in order, pool ``name`` holds within its planned share."""
        load, count = 0.0, 0
        for demand in demands:
            if self._room(name, load) >= demand:
                load, count = load + demand, count + 1
        return count

    def assign(self, demands: Sequence[float]) -> list[str]:
        """A pool for each stream of frame rate ``demands[i]`` (rule 1)."""
        load = dict.fromkeys(PREFERENCE, 0.0)
        out = []
        for demand in demands:
            fits = [name for name in self._pools() if self._room(name, load[name]) >= demand]
            name = fits[0] if fits else max(self._pools(), key=lambda n: self._room(n, load[n]) / self.capacity[n])
            load[name] += demand
            out.append(name)
        return out

    def observe(self, name: str, decoded_fps: float, *, saturated: bool) -> None:
        """A measurement of pool ``name`` (rule 2)."""
        if name not in self.capacity:
            raise ConfigError(f"unknown decoder pool {name!r}")
        if saturated:
            self.capacity[name] = float(decoded_fps)
        elif self.capacity[name] > 0:
            self.capacity[name] = max(self.capacity[name], float(decoded_fps))

    def rebalance(self, assignment: list[str], demands: Sequence[float]) -> list[Move]:
        """Moves that bring every pool within its planned capacity (rule 3); ``assignment`` is updated. A stream
        of no demand (one removed from the run) never moves: it would open a decoder for nothing."""
        now = self._clock()
        if now - self._last_moves < self.hold_s:
            return []
        load = dict.fromkeys(PREFERENCE, 0.0)
        for name, demand in zip(assignment, demands, strict=True):
            load[name] += demand
        moves: list[Move] = []

        def move(i: int, dst: str) -> None:
            src = assignment[i]
            load[src] -= demands[i]
            load[dst] += demands[i]
            assignment[i] = dst
            moves.append(Move(i, src, dst))

        for src, dst in (("nvdec", "cpu"), ("cpu", "nvdec")):  # spill out of a pool that is over
            for i in reversed(range(len(assignment))):
                if self._room(src, load[src]) >= 0:
                    break
                if assignment[i] == src and demands[i] > 0 and self.capacity[dst] > 0 and \
                        self._room(dst, load[dst]) >= demands[i]:
                    move(i, dst)
        for i in range(len(assignment)):  # return to NVDEC what fits there again
            if assignment[i] == "cpu" and demands[i] > 0 and self.capacity["nvdec"] > 0 and \
                    self._room("nvdec", load["nvdec"]) >= demands[i]:
                move(i, "nvdec")
        if moves:
            self._last_moves = now
            self.moves.extend(moves)
        return moves

    def summary(self, assignment: Sequence[str], demands: Sequence[float]) -> dict[str, Any]:
        """Per pool: streams, planned load, capacity, utilisation; whether the plan fits; the binding pool."""
        pools: dict[str, Any] = {}
        for name in PREFERENCE:
            load = sum(d for a, d in zip(assignment, demands, strict=True) if a == name)
            cap = self.capacity[name]
            pools[name] = {"streams": sum(1 for a in assignment if a == name), "load_fps": round(load, 1),
                           "capacity_fps": round(cap, 1), "utilisation": round(load / cap, 3) if cap else None}
        used = {n: p for n, p in pools.items() if p["capacity_fps"]}
        binding = max(used, key=lambda n: used[n]["utilisation"] or 0.0)
        fits = all((p["utilisation"] or 0.0) <= 1.0 for p in used.values())
        return {"pools": pools, "fits": fits, "binding": binding, "moves": len(self.moves)}
