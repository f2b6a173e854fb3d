"""The process-wide gate between CUDA-graph captures and CUDA runs (pure threading, no GPU needed).

On the H200 a capture in one server instance while a second GPU instance replayed its graph
aborted the process; the gate makes a capture wait for running calls and hold new ones back.
"""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("torch")

from streamrt.backends.torch_inductor.engine import _CaptureGate


def test_capture_waits_for_runs_and_holds_new_runs_back() -> None:
    gate = _CaptureGate()
    events: list[str] = []
    run_started, release_run = threading.Event(), threading.Event()

    def long_run() -> None:
        with gate.run():
            events.append("run1 start")
            run_started.set()
            release_run.wait(5)
            events.append("run1 end")

    def capture() -> None:
        with gate.capture():
            events.append("capture start")
            time.sleep(0.05)
            events.append("capture end")

    def late_run() -> None:
        with gate.run():
            events.append("run2")

    t1 = threading.Thread(target=long_run)
    t1.start()
    assert run_started.wait(5)
    t2 = threading.Thread(target=capture)
    t2.start()
    time.sleep(0.05)
    assert events == ["run1 start"]  # the capture waits for the running call
    release_run.set()
    t1.join(5)
    time.sleep(0.01)  # the capture is now inside; a new run must wait for it
    t3 = threading.Thread(target=late_run)
    t3.start()
    for t in (t2, t3):
        t.join(5)
    assert events == ["run1 start", "run1 end", "capture start", "capture end", "run2"]


def test_runs_share_the_gate() -> None:
    gate = _CaptureGate()
    inside = threading.Barrier(3, timeout=5)

    def run() -> None:
        with gate.run():
            inside.wait()  # three runs inside at once, or the barrier times out

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert not inside.broken
