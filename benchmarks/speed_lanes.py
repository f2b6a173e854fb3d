"""Lanes of ``benchmarks/engine_speed.py``: two children building at once, never timing at once.

One call on the H200 has about 520 s, and the variants that matter take longer than that one after
the other (level 5 ~200 s, its warm rebuild ~70 s, torch.compile max-autotune ~250 s, level 3 ~100 s:
``docs/benchmarks/2026-12-01-h200-engine-speed.md``). Most of a build is CPU work (lowering, Triton
and C++ compiles), so ``--lanes 2`` runs two children at a time, each lane taking the next task in
the priority order that it may run (:func:`next_task`).

What keeps the timed numbers clean is the **GPU gate**: before its timed runs (warm-up included) a
child prints :data:`REQUEST` and waits for its ``.go`` file; the parent then stops (``SIGSTOP``)
every process of the other lanes' running children (each child's whole process tree: Inductor's
compile workers and the plan build's compile child lead their own groups), waits
:data:`SETTLE_S` for kernels already queued to drain, and writes the file. When the child prints
:data:`DONE` (or exits) the others continue (``SIGCONT``). So no timed run shares the GPU or the
CPU with another lane. What lanes do change: build seconds are measured while the other lane
builds too (both lanes share the cores), and an autotuning build may benchmark its candidates
while the other lane's build runs kernels; the table's header says when lanes were used.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

__all__ = ["DONE", "REQUEST", "SETTLE_S", "GpuGate", "descendants", "next_task", "wait_for_gate"]

REQUEST = "GPU-GATE request"
DONE = "GPU-GATE done"
SETTLE_S = 0.2
"""Seconds between stopping the other lanes and letting the child time (their queued kernels finish)."""
GATE_WAIT_S = 300.0
"""A child waits at most this long for its turn, then times anyway (and says so)."""


class LaneTask(Protocol):
    """What :func:`next_task` reads of a task (``engine_speed.Task``)."""

    @property
    def lane(self) -> int | None: ...

    def waits_for(self) -> object | None: ...


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from ``/proc``; empty where there is no ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _signal_tree(pid: int, signum: int) -> None:
    for each in descendants(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(each, signum)


class GpuGate:
    """One child times at a time; while it does, the other lanes' children are stopped.

    ``acquire``/``release`` are called from the lanes' output readers (on :data:`REQUEST` and
    :data:`DONE`), ``started``/``finished`` from the lanes; a child that dies holding the gate
    releases it through ``finished``, and one that dies waiting for it never takes it."""

    def __init__(self) -> None:
        self._gate = threading.Lock()
        self._state = threading.Lock()
        self._running: dict[int, subprocess.Popen[str]] = {}
        self._holder: int | None = None
        self._paused: list[int] = []
        self.pauses = 0

    def started(self, lane: int, proc: subprocess.Popen[str]) -> None:
        with self._state:
            self._running[lane] = proc

    def finished(self, lane: int) -> None:
        """The lane's child exited (or was killed): release the gate if it held it."""
        with self._state:
            self._running.pop(lane, None)
        self.release(lane)

    def acquire(self, lane: int, go: Path) -> None:
        """Wait for the gate, stop the other lanes' children, then let ``lane``'s child time."""
        self._gate.acquire()
        with self._state:
            if lane not in self._running:
                self._gate.release()
                return
            self._holder = lane
            self._paused = [proc.pid for other, proc in self._running.items() if other != lane and proc.poll() is None]
            paused = list(self._paused)
        for pid in paused:
            _signal_tree(pid, signal.SIGSTOP)
        if paused:
            self.pauses += 1
            time.sleep(SETTLE_S)
        go.write_text("go\n")

    def release(self, lane: int) -> None:
        with self._state:
            if self._holder != lane:
                return
            paused, self._paused, self._holder = self._paused, [], None
        for pid in paused:
            _signal_tree(pid, signal.SIGCONT)
        self._gate.release()

    def resume_all(self) -> None:
        """On the way out (interrupted): nothing stays stopped."""
        with self._state:
            procs = list(self._running.values())
        for proc in procs:
            _signal_tree(proc.pid, signal.SIGCONT)


def wait_for_gate(gate: str | None, say: Callable[[str], None] = print) -> str:
    """In a child: ask for the GPU and wait for the go file; a note when it had to time without it."""
    if not gate:
        return ""
    go = Path(gate)
    say(REQUEST)
    started = time.monotonic()
    while not go.exists():
        if time.monotonic() - started > GATE_WAIT_S:
            return f"timed without the GPU gate (no turn in {GATE_WAIT_S:.0f} s)"
        time.sleep(0.02)
    waited = time.monotonic() - started
    return f"waited {waited:.0f} s for the GPU" if waited >= 1.0 else ""


def next_task(pending: Sequence[LaneTask], lane: int, finished: set[object]) -> tuple[LaneTask | None, bool]:
    """The task ``lane`` runs next, and whether any task is left for it (now or later).

    First the first pending task pinned to this lane, else the first unpinned one: a lane starts
    with its own work (lane 1 with level 5, say) instead of the cheap rows every lane may take. A
    task pinned to another lane is not this lane's; a rebuild (``L5r``) waits until its first build
    has finished (it reuses that build's timing cache)."""
    left = False
    for pinned in (True, False):
        for task in pending:
            if task.lane != (lane if pinned else None):
                continue
            base = task.waits_for()
            if base is not None and base not in finished:
                left = True
                continue
            return task, True
    return None, left
