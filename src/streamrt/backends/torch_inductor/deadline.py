"""Run a command in its own process group and kill the whole group at a deadline.

Why a process and not a thread: Inductor's autotuning cannot be interrupted from inside the
process (a Python thread cannot stop a compile already running in C++ or in Inductor's worker
pool), so a build that must end on time runs where it can be killed. The child gets a new session
(``start_new_session``), so killing its group also ends Inductor's compile workers and autotuning
subprocesses; the GPU memory they held is freed when they exit.

The level-5 build budget (:mod:`streamrt.backends.torch_inductor.budget`) and
``benchmarks/engine_speed.py`` (one child per variant) both use :func:`run_with_deadline`.

Example:
    >>> result = run_with_deadline([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    >>> result.timed_out, result.returncode is None
    (True, True)
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ChildResult", "child_env", "kill_group", "live_children", "python_command", "run_with_deadline",
           "watch_parent"]

_LIVE: set[subprocess.Popen[str]] = set()
_LIVE_LOCK = threading.Lock()


@dataclass
class ChildResult:
    """How a child ended.

    Attributes:
        returncode: the exit status, or ``None`` when it was killed at the deadline.
        elapsed_s: seconds from start to exit (or to the kill).
        timed_out: it was still running at the deadline and was killed.
        tail: its last output lines (stdout and stderr together).
        lines: how many output lines it wrote in all.
    """

    returncode: int | None
    elapsed_s: float
    timed_out: bool
    tail: list[str] = field(default_factory=list)
    lines: int = 0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the child's process group (it leads its own session), then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def live_children() -> list[subprocess.Popen[str]]:
    """Children started by :func:`run_with_deadline` that are still running (for a SIGTERM handler)."""
    with _LIVE_LOCK:
        return [p for p in _LIVE if p.poll() is None]


def run_with_deadline(
    command: Sequence[str],
    deadline_s: float,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    on_line: Callable[[str], None] | None = None,
    heartbeat_s: float = 30.0,
    on_heartbeat: Callable[[float], None] | None = None,
    keep_lines: int = 40,
    on_start: Callable[[subprocess.Popen[str]], None] | None = None,
) -> ChildResult:
    """Run ``command``; past ``deadline_s`` seconds kill its process group and report ``timed_out``.

    Every output line goes to ``on_line`` as it arrives (a reader thread keeps the pipe drained, so
    a chatty child never blocks); ``on_heartbeat(elapsed_s)`` is called every ``heartbeat_s``
    while it runs; ``on_start(proc)`` once it is started (a caller that pauses or signals it). The
    child is killed too when this function is left by an exception (a KeyboardInterrupt, a handler's
    SystemExit), so it never outlives the caller's wait.
    """
    started = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
    count = [0]
    proc = subprocess.Popen(
        list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        start_new_session=True, env=dict(env) if env is not None else None, cwd=cwd,
    )
    with _LIVE_LOCK:
        _LIVE.add(proc)
    if on_start is not None:
        on_start(proc)

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            tail.append(line)
            count[0] += 1
            if on_line is not None:
                on_line(line)

    reader = threading.Thread(target=read, name="deadline-reader", daemon=True)
    reader.start()
    timed_out = False
    try:
        next_beat = started + heartbeat_s
        while True:
            now = time.monotonic()
            left = started + deadline_s - now
            if left <= 0:
                timed_out = True
                kill_group(proc)
                break
            try:
                proc.wait(timeout=max(0.05, min(left, next_beat - now, 1.0)))
                break
            except subprocess.TimeoutExpired:
                pass
            if on_heartbeat is not None and time.monotonic() >= next_beat:
                on_heartbeat(time.monotonic() - started)
                next_beat += heartbeat_s
    finally:
        if proc.poll() is None:
            kill_group(proc)
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    elapsed = time.monotonic() - started
    reader.join(timeout=5)
    return ChildResult(None if timed_out else proc.returncode, elapsed, timed_out, list(tail), count[0])


def _watch(parent: int, interval_s: float) -> None:
    while True:
        time.sleep(interval_s)
        if os.getppid() != parent:
            os._exit(3)  # the parent is gone (killed without its finally): nobody waits for this work


@contextlib.contextmanager
def watch_parent(interval_s: float = 1.0) -> Iterator[None]:
    """In a child: exit when the parent process dies, so an orphaned compile does not run on."""
    threading.Thread(target=_watch, args=(os.getppid(), interval_s), name="parent-watch", daemon=True).start()
    yield


def python_command(module: str, *args: str) -> list[str]:
    """``python -m module args`` with this interpreter (the child sees the same ``sys.path`` via ``PYTHONPATH``)."""
    return [sys.executable, "-m", module, *args]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with its ``sys.path`` in ``PYTHONPATH``: the child imports the same code."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    given = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, *given]))
    env.update(extra or {})
    return env
