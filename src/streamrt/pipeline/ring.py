"""Where stages run and what each slot remembers: stream placement per topology, slot state.

:func:`lane_streams` maps a lane's stages onto streams as :class:`~streamrt.pipeline.Topology`
describes. :class:`SlotState` is the executor's bookkeeping of one ring slot: the item it holds,
the pre-allocated events that chain its stages (re-recorded for every item, so the steady state
creates none), CUDA graphs captured for it, and host timings for the trace.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from streamrt.device.base import Device, Event, Stream
from streamrt.errors import PipelineError
from streamrt.pipeline.config import Topology
from streamrt.pipeline.stage import Slot, Stage

__all__ = ["SlotState", "lane_streams"]


def lane_streams(device: Device, stages: Sequence[Stage], topology: Topology, lane: int) -> tuple[Stream, ...]:
    """One stream per stage, shared as the topology says.

    ``sync``: device stages on one device stream, host stages inline (on a CPU device everything
    is inline). ``single``: device stages on one device stream. ``streams``: one device stream per
    stage group. Host stages get a host stream per group except in ``sync``.
    """
    made: dict[str, Stream] = {}
    out = []
    for stage in stages:
        if topology is Topology.SYNC:
            key = "main" if device.is_cuda and not stage.on_host else "inline"
        elif stage.on_host:
            key = f"host:{stage.group}"
        else:
            key = "main" if topology is Topology.SINGLE else stage.group
        if key not in made:
            name = f"lane{lane}/{key.removeprefix('host:')}"
            if key == "inline":
                made[key] = device.host_stream(name, inline=True)
            elif stage.on_host:
                made[key] = device.host_stream(name)
            else:
                made[key] = device.stream(name)
        out.append(made[key])
    return tuple(out)


class SlotState:
    """The executor's bookkeeping of one slot and the item it currently holds."""

    def __init__(self, slot: Slot, stages: int, trace: bool) -> None:
        streams = slot.lane.streams
        self.slot = slot
        self.ends: list[Event] = [s.new_event(timing=trace and s.is_cuda) for s in streams]
        self.starts: list[Event | None] = [s.new_event(timing=True) if trace and s.is_cuda else None for s in streams]
        self.graphs: list[Any | None] = [None] * stages
        self.item: int | None = None
        self.error: PipelineError | None = None
        self.launched = threading.Event()  # set once every stage of the item has been launched
        self.next_stage = 0  # first stage not launched yet (for timeout reports)
        self.submitted = 0.0
        self.ran = [False] * stages
        self.host_t0 = [0.0] * stages
        self.host_t1 = [0.0] * stages
        self.thread = [""] * stages

    def begin(self, item: int, value: Any) -> None:
        """Take ``item``; the slot must be free (its previous item collected)."""
        self.item = item
        self.error = None
        self.slot.input = value
        self.slot.output = None
        self.launched.clear()
        self.next_stage = 0
        self.ran = [False] * len(self.ran)
        self.submitted = time.perf_counter()

    def release(self) -> None:
        """Free the slot for the next item (its buffers stay allocated)."""
        self.item = None
        self.slot.input = None
