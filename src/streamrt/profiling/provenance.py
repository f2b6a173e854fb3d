"""Where a measurement came from: the commit every benchmark and report records."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = ["git_commit", "report_header"]


def git_commit(cwd: str | Path | None = None) -> str:
    """Short commit of ``cwd``'s checkout, ``+dirty`` when tracked files changed, else ``unknown``.

    ``$STREAMRT_COMMIT`` overrides it: the GPU machine gets a copy of the working tree without git
    history, so the commit is passed in from where the run was started.
    """
    if os.environ.get("STREAMRT_COMMIT"):
        return os.environ["STREAMRT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10, cwd=cwd)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0 or not head.stdout.strip():
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def report_header(command: Sequence[str], root: str | Path | None = None, machine_note: str = "") -> list[str]:
    """The lines a benchmark report starts with: date (UTC), commit of ``root``'s checkout, machine
    (host name and CPU count, then ``machine_note``) and the ``command`` that produced it.

    Example:
        >>> report_header(["python", "benchmarks/x.py", "--seconds", "5"])[3]
        '- command: `python benchmarks/x.py --seconds 5`'
    """
    note = f", {machine_note}" if machine_note else ""
    return [f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            f"- commit: {git_commit(root)}",
            f"- machine: {platform.node()}, {os.cpu_count()} CPUs{note}",
            f"- command: `{shlex.join(command)}`"]
