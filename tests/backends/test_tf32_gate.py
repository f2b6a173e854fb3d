"""backend_flags: torch's TF32/cuDNN switches are process-wide, so blocks that want different values
must never overlap (an IEEE fp32 plan would silently run under a TF32 plan's math); blocks that want
the same values run together; a nested block of the same thread does not deadlock; everything is
restored afterwards. Runs on the CPU (the flags are plain process state there too)."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from streamrt.backends.torch_inductor.tf32 import backend_flags  # noqa: E402


def _flags() -> tuple[bool, bool, bool]:
    return (bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32),
            bool(torch.backends.cudnn.benchmark))


def test_blocks_of_other_flags_never_overlap_and_each_sees_its_own() -> None:
    before = _flags()
    wrong: list[str] = []
    inside = {True: 0, False: 0}
    overlap_same = [False]
    lock = threading.Lock()

    def worker(tf32: bool, rounds: int) -> None:
        for _ in range(rounds):
            with backend_flags(tf32):
                with lock:
                    inside[tf32] += 1
                    if inside[not tf32]:
                        wrong.append(f"tf32={tf32} ran while tf32={not tf32} did")
                    if inside[tf32] > 1:
                        overlap_same[0] = True
                for _ in range(20):
                    if _flags()[:2] != (tf32, tf32):
                        wrong.append(f"tf32={tf32} saw {_flags()}")
                    time.sleep(0.0002)
                with lock:
                    inside[tf32] -= 1

    threads = [threading.Thread(target=worker, args=(i % 2 == 0, 40)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a block never got the flags (starved or deadlocked)"
    assert not wrong, wrong[:5]
    assert overlap_same[0], "blocks wanting the same flags should run together"
    assert _flags() == before


def test_nested_block_of_the_same_thread_switches_and_restores() -> None:
    before = _flags()
    with backend_flags(False, cudnn_benchmark=True):
        assert _flags() == (False, False, True)
        with backend_flags(True):
            assert _flags() == (True, True, False)
        assert _flags() == (False, False, True)
        with backend_flags(False, cudnn_benchmark=True):
            assert _flags() == (False, False, True)
    assert _flags() == before
