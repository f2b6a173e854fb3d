"""Pipeline test doubles, offered as fixtures: a device whose device streams act like CUDA
streams, and random per-stage delays."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable, Sequence

import pytest

from fake_cuda import FakeCudaDevice, FakeCudaStream  # noqa: F401 - re-exported to the tests
from streamrt.device import Stream
from streamrt.pipeline import Slot, Stage


def with_delays(stages: Sequence[Stage], seed: int, max_s: float) -> list[Stage]:
    """The same stages, each preceded by a random sleep (a thread-safe RNG per stage)."""
    out = []
    for index, stage in enumerate(stages):
        rng = random.Random(seed * 1000 + index)
        lock = threading.Lock()

        def fn(slot: Slot, item: int, stream: Stream, _fn=stage.fn, _rng=rng, _lock=lock) -> None:
            with _lock:
                pause = _rng.random() * max_s
            time.sleep(pause)
            _fn(slot, item, stream)

        out.append(dataclasses.replace(stage, fn=fn))
    return out


@pytest.fixture
def fake_cuda_device() -> FakeCudaDevice:
    return FakeCudaDevice()


@pytest.fixture
def delayed() -> Callable[[Sequence[Stage], int, float], list[Stage]]:
    return with_delays
