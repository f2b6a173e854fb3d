"""``run_with_deadline``: a child past its deadline is killed with its whole process group; output is relayed."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from streamrt.backends.torch_inductor.deadline import run_with_deadline

# A child that starts a grandchild (as Inductor starts compile workers) and sleeps.
_TREE = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[1], "w").write(str(grandchild.pid))
print("started", flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): it is dead once its state says so.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_a_child_past_its_deadline_is_killed_with_its_grandchildren(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    lines: list[str] = []
    beats: list[float] = []
    started = time.monotonic()
    result = run_with_deadline([sys.executable, "-c", _TREE, str(pid_file)], 3.0, on_line=lines.append,
                               heartbeat_s=1.0, on_heartbeat=beats.append)
    assert result.timed_out and result.returncode is None and not result.ok
    assert 3.0 <= result.elapsed_s < 15 and time.monotonic() - started < 20
    assert lines == ["started"] and result.tail == ["started"] and beats
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_a_child_that_finishes_in_time_reports_its_exit_status() -> None:
    result = run_with_deadline([sys.executable, "-c", "print('a'); print('b'); raise SystemExit(4)"], 30.0)
    assert not result.timed_out and result.returncode == 4 and result.tail == ["a", "b"] and result.lines == 2
