"""Checks of the H200 call scripts' dry runs, shared by their CPU tests: every command they would run names a
file that exists and only flags its program accepts, so a GPU call cannot die on a renamed script or flag."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dry_run_commands(script: str, *args: str, **env: str) -> list[str]:
    """The commands ``bash scripts/SCRIPT ARGS`` prints with ``DRY_RUN=1`` (lines ``[step, timeout N s] CMD``)."""
    out = subprocess.run(["bash", f"scripts/{script}", *args], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "DRY_RUN": "1", **env})
    return [line.split("] ", 1)[1] for line in out.stdout.splitlines() if line.startswith("[")]


def _help(argv: list[str]) -> str:
    return subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, cwd=ROOT, check=True,
                          env={**os.environ, "PYTHONPATH": f"{ROOT}/src"}).stdout


def assert_runnable(command: str) -> None:
    """``command`` names an existing script (or test path) and, for the CLI, scripts and benchmarks, only
    flags that its ``--help`` lists."""
    words = shlex.split(command)
    flags = [w.split("=", 1)[0] for w in words if w.startswith("--")]  # --name=value: the name
    if words[1:3] == ["-m", "streamrt"]:  # the CLI from the checkout: its subcommand knows every flag
        help_text = _help(["-m", "streamrt", words[3]])
        assert flags and all(flag in help_text for flag in flags), (words[3], flags)
        return
    if words[:3] == ["python3", "-m", "pytest"]:  # test paths exist (pytest's own flags are pytest's)
        paths = [w for w in words[3:] if w.startswith("tests")]
        assert paths and all((ROOT / p.split("::")[0]).exists() for p in paths), paths
        return
    script = next(w for w in words if w.endswith((".py", ".sh")) or w.startswith("tests/"))
    assert (ROOT / script).exists(), script
    if script.endswith(".py") and script.startswith(("scripts/", "benchmarks/")):
        help_text = _help([str(ROOT / script)])
        assert all(flag in help_text for flag in flags), (script, flags)
