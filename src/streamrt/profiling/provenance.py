"""Where a measurement came from: the commit every benchmark and report records."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["git_commit"]


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
