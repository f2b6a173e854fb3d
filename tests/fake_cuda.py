"""A CPU device whose device streams act like CUDA streams (shared by pipeline and video tests).

Worker-thread streams that claim to be CUDA and, like real ones, refuse to wait on the device for a
pending host event: the executor then takes its CUDA-only paths on a machine without a GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import ClassVar

from streamrt.device import CpuDevice, HostEvent, HostStream, Stream
from streamrt.device.base import Event
from streamrt.errors import PipelineError

__all__ = ["FakeCudaDevice", "FakeCudaStream"]


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
