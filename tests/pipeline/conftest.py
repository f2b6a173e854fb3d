"""Pipeline test doubles, offered as fixtures: a device whose device streams act like CUDA
streams, and random per-stage delays."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import ClassVar

import pytest

from streamrt.device import CpuDevice, HostEvent, HostStream, Stream
from streamrt.device.base import Event
from streamrt.errors import PipelineError
from streamrt.pipeline import Slot, Stage


class FakeCudaStream(HostStream):
    """A worker-thread stream that claims to be CUDA and, like one, refuses to wait on the
    device for a pending host event. It makes the executor take its CUDA-only paths
    (continuations after host stages) on a machine without a GPU."""

    launched_from: ClassVar[set[str]] = set()  # threads that launched work here (class-wide, for asserts)

    @property
    def is_cuda(self) -> bool:
        return True

    def launch(self, fn: Callable[[], object]) -> None:
        FakeCudaStream.launched_from.add(threading.current_thread().name)
        super().launch(fn)

    def wait(self, event: Event) -> None:
        if getattr(event, "fake_cuda", False) or event.query():
            super().wait(event)
            return
        raise PipelineError(f"fake CUDA stream '{self.name}' asked to wait for a pending host event")

    def new_event(self, timing: bool = False) -> HostEvent:
        event = HostEvent(timing)
        event.fake_cuda = True  # type: ignore[attr-defined]
        return event


class FakeCudaDevice(CpuDevice):
    """CPU buffers, host streams for host stages, fake CUDA streams for device stages."""

    def stream(self, name: str, *, priority: int = 0) -> Stream:
        return FakeCudaStream(name)


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
