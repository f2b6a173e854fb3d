"""The check's CPU placements (``gpu_serving_check.py --engine-cpus``): the server places its engine process and
front ends itself (``streamrt serve --engine-cpus``, :mod:`streamrt.device.cpus`); the check puts its clients beside
the front ends, on the CPUs the engine process leaves.

On an H100 host of 16 CPUs (2026-12-07) the engine process spent 42 us of CPU per 64 B request behind 8 load drivers
and 74 us behind 8 h2corn front ends with 8 client processes on the same CPUs; pinned to CPUs 0-1 (another H100 host,
the same day) 43 us against 53 us unpinned, 23,613 against 19,461 requests/s. The scripts folder is not a package:
the check imports this with ``scripts/`` on ``sys.path``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

from streamrt.device.cpus import format_cpu_list, parse_cpu_list, split_cpus, usable_cpus
from streamrt.device.threads import physical_cores
from streamrt.errors import ConfigError


def engine_cpus_arg(text: str) -> list[frozenset[int] | None]:
    """``--engine-cpus``: placements separated by ``;``, each ``none`` (the kernel places every process) or a CPU
    list for the engine process; each part runs once per placement.

    >>> [None if p is None else sorted(p) for p in engine_cpus_arg("none;0-1")]
    [None, [0, 1]]
    """
    try:
        placements = [None if p.strip() == "none" else parse_cpu_list(p) for p in text.split(";") if p.strip()]
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not placements:
        raise argparse.ArgumentTypeError(f"expected 'none' or CPU lists separated by ';', got {text!r}")
    return placements


def label(engine: frozenset[int] | None) -> str:
    """A placement in the kernel's CPU-list syntax, for the report (``none`` for no pinning)."""
    return "none" if engine is None else format_cpu_list(engine)


def server_args(engine: frozenset[int] | None) -> list[str]:
    """The ``streamrt serve`` flags of a placement."""
    return [] if engine is None else ["--engine-cpus", format_cpu_list(engine)]


def host_speed() -> str:
    """The CPU model (``/proc/cpuinfo``) and one core's speed at a fixed pure-Python loop (ns per iteration, the
    median of 5 runs), for the report's header: hosts of one GPU kind differ ~2x in server CPU per request (an
    H100 host on 2026-12-07 took 400 us per 64 B gRPC request where another had taken 234 us), and the front
    end is Python."""
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    runs = []
    for _ in range(5):
        start = time.perf_counter_ns()
        total = 0
        for i in range(200_000):
            total += i & 7
        runs.append((time.perf_counter_ns() - start) / 200_000)
    return f"{model}; Python loop {statistics.median(runs):.1f} ns/iteration"


def topology() -> str:
    """This machine's CPUs, physical cores (:func:`~streamrt.device.threads.physical_cores`) and SMT siblings
    (Linux sysfs), for the report's header."""
    siblings = set()
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/thread_siblings_list"):
        with contextlib.suppress(OSError):
            siblings.add(path.read_text().strip())
    shown = sorted(siblings, key=lambda s: int(s.replace("-", ",").split(",")[0]))
    if shown and len(shown) == len(list(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"))):
        return f"{os.cpu_count()} CPUs in {physical_cores()} cores; no SMT siblings"
    return (f"{os.cpu_count()} CPUs in {physical_cores()} cores; SMT siblings "
            + (" ".join(shown[:8]) + (" ..." if len(shown) > 8 else "") if shown else "not readable"))


def rest_of(engine: frozenset[int] | None) -> frozenset[int] | None:
    """The usable CPUs left for the front ends and clients when the engine process takes ``engine`` (None for no
    placement); ValueError for a placement this machine cannot give, before any server starts."""
    return None if engine is None else split_cpus(engine, need_rest=True)


@contextlib.contextmanager
def clients_beside_front_ends(engine: frozenset[int] | None) -> Iterator[frozenset[int] | None]:
    """Within the block this process, and the client processes it starts, run on the CPUs the engine process leaves
    (:func:`rest_of`); its own mask is restored after. ``engine=None`` changes nothing. Yields those CPUs."""
    rest = rest_of(engine)
    if rest is None:
        yield None
        return
    usable = usable_cpus()
    os.sched_setaffinity(0, rest)
    try:
        yield rest
    finally:
        os.sched_setaffinity(0, usable)
