"""Part (a)'s CPU placement experiment: the engine process on CPUs of its own, the front ends and clients on the
rest (``gpu_serving_check.py --engine-cpus``).

On an H100 host (2026-12-07) the engine process spent 42 us of CPU per 64 B request behind 8 load drivers and 74 us
behind 8 h2corn front ends with 8 client processes on the same 16 CPUs, where its one event loop saturated. Pinning
the engine away from the rest says whether sharing CPUs (SMT siblings, caches, migrations) is what costs the
difference. The scripts folder is not a package: the check imports this with ``scripts/`` on ``sys.path``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from streamrt.device.threads import physical_cores
from streamrt.testing.server_process import child_pids


def cpu_list(text: str) -> frozenset[int]:
    """``0-1,8`` -> {0, 1, 8} (the kernel's CPU-list syntax).

    >>> sorted(cpu_list("0-2,8"))
    [0, 1, 2, 8]
    """
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()) or (dash and int(last) < int(first)):
            raise argparse.ArgumentTypeError(f"expected a CPU list such as 0-1,8, got {text!r}")
        cpus.update(range(int(first), int(last if dash else first) + 1))
    if not cpus:
        raise argparse.ArgumentTypeError(f"expected a CPU list such as 0-1,8, got {text!r}")
    return frozenset(cpus)


def engine_cpus_arg(text: str) -> list[frozenset[int] | None]:
    """``--engine-cpus``: placements separated by ``;``, each ``none`` (the kernel places every process) or a CPU
    list for the engine process; part (a) runs once per placement.

    >>> [None if p is None else sorted(p) for p in engine_cpus_arg("none;0-1")]
    [None, [0, 1]]
    """
    placements = [None if p.strip() == "none" else cpu_list(p) for p in text.split(";") if p.strip()]
    if not placements:
        raise argparse.ArgumentTypeError(f"expected 'none' or CPU lists separated by ';', got {text!r}")
    return placements


def label(engine: frozenset[int] | None) -> str:
    """A placement in the kernel's CPU-list syntax, for the report (``none`` for no pinning)."""
    if engine is None:
        return "none"
    cpus, runs = sorted(engine), []
    start = prev = cpus[0]
    for cpu in [*cpus[1:], -2]:
        if cpu != prev + 1:
            runs.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cpu
        prev = cpu
    return ",".join(runs)


def topology() -> str:
    """This machine's CPUs, physical cores (:func:`~streamrt.device.threads.physical_cores`) and SMT siblings
    (Linux sysfs), for the report's header."""
    siblings = set()
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/thread_siblings_list"):
        with contextlib.suppress(OSError):
            siblings.add(path.read_text().strip())
    shown = sorted(siblings, key=lambda s: int(s.replace("-", ",").split(",")[0]))
    return (f"{os.cpu_count()} CPUs in {physical_cores()} cores; SMT siblings "
            + (" ".join(shown[:8]) + (" ..." if len(shown) > 8 else "") if shown else "not readable"))


def _pin_process(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads started later inherit their creator's mask)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):  # the thread exited meanwhile
            os.sched_setaffinity(int(task.name), cpus)


def _descendants(pid: int) -> list[int]:
    found, queue = [], child_pids(pid)
    while queue:
        child = queue.pop()
        found.append(child)
        queue += child_pids(child)
    return found


def rest_of(engine: frozenset[int] | None) -> frozenset[int] | None:
    """The usable CPUs left for the front ends and clients when the engine process takes ``engine`` (None for no
    placement); ValueError for a placement this machine cannot give, before any server starts."""
    if engine is None:
        return None
    usable = frozenset(os.sched_getaffinity(0))
    if not engine <= usable:
        raise ValueError(f"--engine-cpus {label(engine)}: not all of them are usable here ({label(usable)})")
    if not usable - engine:
        raise ValueError(f"--engine-cpus {label(engine)}: leaves no CPU for the front ends and clients")
    return usable - engine


@contextlib.contextmanager
def placed(server_pid: int, engine: frozenset[int] | None) -> Iterator[frozenset[int] | None]:
    """Within the block, the server's engine process (``server_pid``) runs on ``engine`` and its descendants (the
    front-end processes) and this process's future children (the clients) on the other usable CPUs (:func:`rest_of`);
    this process's own mask is restored after. ``engine=None`` changes nothing. Yields the CPUs of the rest. A front
    end the server restarts inside the block inherits the engine's CPUs."""
    rest = rest_of(engine)
    if engine is None or rest is None:
        yield None
        return
    usable = frozenset(os.sched_getaffinity(0))
    _pin_process(server_pid, engine)
    for child in _descendants(server_pid):
        _pin_process(child, rest)
    os.sched_setaffinity(0, rest)
    try:
        yield rest
    finally:
        os.sched_setaffinity(0, usable)
