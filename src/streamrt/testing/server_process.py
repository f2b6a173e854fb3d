"""A ``streamrt serve`` (or any KServe v2 server) in a subprocess: a free port, readiness, a clean stop.

Shared by the benchmarks and scripts that start a real server, so each does not write its own wait
loop and terminate/kill sequence.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

__all__ = ["child_pids", "free_port", "stop", "wait_ready"]


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice; free until someone binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, timeout: float, process: subprocess.Popen[bytes] | None = None, *,
               path: str = "/v2/health/ready", log: Path | None = None, poll_s: float = 0.25) -> None:
    """Return once ``http://127.0.0.1:port{path}`` answers 200.

    Raises:
        RuntimeError: ``process`` exited first, or ``timeout`` seconds passed; with the end of ``log``.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}) before it was ready{_tail(log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server on port {port} was not ready after {timeout:g} s{_tail(log)}")
        time.sleep(poll_s)


def child_pids(pid: int) -> list[int]:
    """The live child processes of ``pid`` (a server's front-end workers; Linux /proc, empty elsewhere)."""
    found: list[int] = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):  # the thread exited meanwhile
            found += [int(child) for child in listing.read_text().split()]
    return found


def stop(process: subprocess.Popen[bytes], timeout: float = 30) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds, with its child processes (``--frontend-processes``
    workers that a killed server cannot stop itself); the exit status (None if even that hung)."""
    process.terminate()
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        for child in child_pids(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        process.kill()
        try:
            return process.wait(10)
        except subprocess.TimeoutExpired:
            return None


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return ":\n" + log.read_text(errors="replace")[-3000:]
