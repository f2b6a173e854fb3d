"""A long torch_inductor build says it is alive, and says when it makes a CPU plan because no GPU is here.

The heartbeat is tested on a fake slow step (a sleep); one real tiny CPU build checks that the
build's progress carries both the CPU-target line (before the compile) and heartbeat lines.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from streamrt.backends.torch_inductor import heartbeat
from streamrt.backends.torch_inductor.heartbeat import with_heartbeat


def test_a_slow_step_beats_with_the_time_so_far_and_says_when_done() -> None:
    lines: list[str] = []
    assert with_heartbeat(lambda: time.sleep(0.55) or "plan", lines.append, "compiling kernels", every_s=0.1) == "plan"
    beats = [line for line in lines if "still working" in line]
    assert len(beats) >= 3, lines
    assert all(re.fullmatch(r"compiling kernels: still working, \d+ s so far", b) for b in beats), beats
    assert re.fullmatch(r"compiling kernels: done in \d+ s", lines[-1]), lines


def test_a_quick_step_stays_silent_and_no_beat_outlives_it() -> None:
    lines: list[str] = []
    assert with_heartbeat(lambda: 3, lines.append, "compiling", every_s=0.2) == 3
    time.sleep(0.3)
    assert lines == [] and not any(t.name == "streamrt:build-heartbeat" for t in threading.enumerate())


def test_a_failing_step_raises_and_the_heartbeat_stops() -> None:
    lines: list[str] = []

    def fail() -> None:
        time.sleep(0.25)
        raise RuntimeError("compiler died")

    with pytest.raises(RuntimeError, match="compiler died"):
        with_heartbeat(fail, lines.append, "compiling", every_s=0.1)
    count = len(lines)
    time.sleep(0.3)
    assert len(lines) == count and count >= 1


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_cpu_build_says_it_is_a_cpu_plan_and_beats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import streamrt
    from helpers import catalogue_file
    from streamrt._features import cuda_available
    from streamrt.config import BuildConfig
    from streamrt.types import ShapeProfile, ShapeRange

    monkeypatch.setattr(heartbeat, "HEARTBEAT_S", 1.0)  # the compile takes tens of seconds on 2 cores
    lines: list[str] = []
    profile = ShapeProfile({"x": ShapeRange((1, 4, 6), (2, 4, 6), (4, 4, 6))})
    config = BuildConfig(backend="torch_inductor", profiles=(profile,))  # device auto: what a user types
    streamrt.build(catalogue_file("dynamic_batch", tmp_path), config, tmp_path / "m.plan", cache=False,
                   cache_dir=tmp_path / "cache", progress=lines.append)
    notes = [i for i, line in enumerate(lines) if line.startswith("no CUDA device: building a CPU plan")]
    compiling = next(i for i, line in enumerate(lines) if "compiling kernels for" in line)
    if cuda_available():
        assert notes == [], lines
        return
    assert len(notes) == 1 and notes[0] < compiling, lines
    assert "it will not run on a GPU" in lines[notes[0]] and "--option device=cpu" in lines[notes[0]]
    assert any(re.search(r"compiling kernels for cpu: still working, \d+ s so far", line) for line in lines), lines
