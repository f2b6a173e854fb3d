"""How many intra-op threads a CPU engine uses by default: a policy that does not collapse under load.

OpenMP teams spin at their barriers. When a team has more threads than there are idle cores,
every parallel region waits for a thread the OS has descheduled: a torch_inductor CPU plan went
from 8 ms to 400-800 ms per call with 2 threads on a 2-core machine busy with other work, and
stayed at 12 ms with 1 thread. So the default leaves a core free and shrinks with the load:

- 2 usable cores or fewer: 1 thread;
- otherwise ``min(physical cores - 1, usable cores - round(1-minute load average))``, at least 1.

"Usable" cores are those this process may run on (its CPU affinity); physical cores count
hyper-threaded siblings once. The policy is evaluated when an execution context is created, so a
context created on a busy machine stays small. Override it per plan (``--option threads=N`` at
build time), per context (``create_context(threads=N)``) or per process
(``STREAMRT_CPU_THREADS=N``).

Example:
    >>> default_cpu_threads(cores=16, physical=8, load=0.0)
    7
    >>> default_cpu_threads(cores=2, physical=2, load=0.0)
    1
"""

from __future__ import annotations

import os
from pathlib import Path

from streamrt.errors import ConfigError

__all__ = ["ENV_VAR", "default_cpu_threads", "physical_cores", "resolve_cpu_threads", "usable_cores"]

ENV_VAR = "STREAMRT_CPU_THREADS"


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask), or ``os.cpu_count()`` where there is none."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def physical_cores() -> int:
    """Distinct physical cores among the usable CPUs (Linux sysfs topology); usable cores elsewhere."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return usable_cores()
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            return len(cpus)
        cores.add((package, core))
    return max(1, len(cores))


def default_cpu_threads(cores: int | None = None, physical: int | None = None, load: float | None = None) -> int:
    """The default intra-op thread count (see module docs); arguments default to this machine's values."""
    cores = usable_cores() if cores is None else cores
    physical = min(cores, physical_cores() if physical is None else physical)
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
    if cores <= 2:
        return 1
    return max(1, min(physical - 1, cores - round(load)))


def resolve_cpu_threads(requested: int | None) -> int:
    """``requested`` if >= 1, else ``$STREAMRT_CPU_THREADS`` if set, else :func:`default_cpu_threads`.

    ``None`` and 0 mean "automatic".
    """
    if not requested:
        env = os.environ.get(ENV_VAR, "").strip()
        try:
            requested = int(env) if env else 0
        except ValueError:
            raise ConfigError(f"{ENV_VAR} must be an integer >= 1 (0 = automatic), got {env!r}") from None
    if requested < 0:
        raise ConfigError(f"CPU threads must be an integer >= 1 (0 = automatic), got {requested}")
    return int(requested) if requested else default_cpu_threads()
