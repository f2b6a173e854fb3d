"""CPU placement: CPU lists in the kernel's syntax, and every thread of a process moved onto a set of CPUs.

What ``streamrt serve --engine-cpus`` uses (Triton's analogue: ``--host-policy=NAME,cpu-cores=LIST``): the engine
process on CPUs of its own, its front-end processes on the rest. On an H100 host of 16 CPUs (2026-12-07, 8 h2corn
front ends, 8 client processes) the engine process on CPUs 0-1 served 64 B gRPC requests at 23,613 requests/s
against 19,461 unpinned in the same run (its CPU per request 43 us against 53 us).

A thread created later inherits the mask of the thread that creates it, so a process pinned before it starts its
pools (ONNX Runtime's, torch's, the CUDA driver's) keeps all of them on its CPUs.

Example:
    >>> sorted(parse_cpu_list("0-2,8"))
    [0, 1, 2, 8]
    >>> format_cpu_list({0, 1, 2, 8, 10, 11})
    '0-2,8,10-11'
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from streamrt.errors import ConfigError

__all__ = ["format_cpu_list", "parse_cpu_list", "pin_process", "split_cpus", "usable_cpus"]


def parse_cpu_list(text: str) -> frozenset[int]:
    """``"0-1,8"`` -> {0, 1, 8}; ConfigError for anything else (an empty list, ``3-1``, a name)."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()) or (dash and int(last) < int(first)):
            cpus.clear()
            break
        cpus.update(range(int(first), int(last if dash else first) + 1))
    if not cpus:
        raise ConfigError(f"expected a CPU list such as 0-1,8 (the kernel's syntax), got {text!r}",
                          hint="CPU numbers as `nproc` and `lscpu` count them")
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The kernel's CPU-list syntax for ``cpus`` (ranges joined by commas)."""
    ordered, runs = sorted(cpus), []
    if not ordered:
        return ""
    start = prev = ordered[0]
    for cpu in [*ordered[1:], -2]:
        if cpu != prev + 1:
            runs.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cpu
        prev = cpu
    return ",".join(runs)


def usable_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity mask)."""
    return frozenset(os.sched_getaffinity(0))


def split_cpus(engine: Iterable[int], *, need_rest: bool) -> frozenset[int]:
    """The usable CPUs left when the engine process takes ``engine``; ConfigError, before anything moves, when
    ``engine`` names a CPU this process may not use, or leaves none while ``need_rest`` (front-end processes)."""
    engine, usable = frozenset(engine), usable_cpus()
    if not engine <= usable:
        raise ConfigError(f"--engine-cpus {format_cpu_list(engine)}: CPU(s) {format_cpu_list(engine - usable)} "
                          f"are not usable here", hint=f"this process may run on CPUs {format_cpu_list(usable)}")
    rest = usable - engine
    if need_rest and not rest:
        raise ConfigError(f"--engine-cpus {format_cpu_list(engine)} leaves no CPU for the front-end processes",
                          hint=f"give the engine a part of {format_cpu_list(usable)}, e.g. "
                               f"{format_cpu_list(sorted(usable)[:max(1, len(usable) // 8)])}")
    return rest


def pin_process(pid: int, cpus: Iterable[int]) -> None:
    """Every thread of process ``pid`` onto ``cpus`` (threads it starts later inherit their creator's mask)."""
    mask = frozenset(cpus)
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):  # the thread exited meanwhile
            os.sched_setaffinity(int(task.name), mask)
