"""``PipelineConfig``: topology, ring size, workers, timeouts, CUDA graphs and tracing.

Example:
    >>> cfg = PipelineConfig.from_dict({"topology": "streams", "workers": 2, "ring_size": 3})
    >>> cfg.topology, cfg.in_flight
    (<Topology.STREAMS: 'streams'>, 6)
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamrt import _configio
from streamrt.config import _enum
from streamrt.errors import ConfigError

__all__ = ["PipelineConfig", "Topology"]


class Topology(enum.Enum):
    """How a lane maps stages onto streams.

    * ``SYNC`` (a): the naive loop. One device stream, host stages inline, pageable host buffers
      (blocking copies), a host sync after every item. One worker, one slot.
    * ``STREAMS`` (b): one stream per stage (or per stage ``stream`` group), chained per item by
      events, a ring of slots with pinned buffers.
    * ``SINGLE``: all device stages of a lane on one stream, but asynchronous with a ring of
      pinned slots. Combined with ``workers > 1`` it is the replicated-workers topology (c) in
      its simplest form (one stream and one engine context per worker).

    ``workers > 1`` replicates whole lanes (c): each has its own streams, slots and engine
    context, fed round-robin. It combines with ``STREAMS`` and ``SINGLE``.
    """

    SYNC = "sync"
    STREAMS = "streams"
    SINGLE = "single"


@dataclass(frozen=True)
class PipelineConfig:
    """Settings of one :class:`~streamrt.pipeline.Pipeline`.

    Attributes:
        topology: see :class:`Topology`.
        workers: replicated lanes (c); each owns its streams, slots and engine context.
        ring_size: slots per lane, i.e. items in flight per lane (``SYNC`` always uses 1).
        pinned: page-locked host buffers; None means "all topologies but ``SYNC``".
        cuda_graphs: capture stages marked ``graphable`` per slot and replay them (CUDA only).
        launch_thread: launch the CUDA stages that follow a host stage from a thread of the lane's
            own (its ``launch`` host stream) instead of from the host stage's thread, which then
            starts its next item at once (see the executor's step 3). ``SYNC`` has none: its host
            stages run inline, so the synchronous loop stays the naive loop.
        trace: record a span per stage execution (device events on CUDA, host clock elsewhere).
        nvtx: push an NVTX range around every stage launch (CUDA only; for Nsight Systems).
        stage_timeout_s: longest wait for one item's result before ``StageTimeoutError``.
        close_timeout_s: longest wait for in-flight work and workers in ``close()``.
        device: ``"auto"``, ``"cuda"`` or ``"cpu"`` (used when no device object is passed).
    """

    topology: Topology = Topology.STREAMS
    workers: int = 1
    ring_size: int = 4
    pinned: bool | None = None
    cuda_graphs: bool = False
    launch_thread: bool = False
    trace: bool = False
    nvtx: bool = False
    stage_timeout_s: float = 30.0
    close_timeout_s: float = 30.0
    device: str = "auto"

    def __post_init__(self) -> None:
        topology = _enum(Topology, self.topology, "topology")
        object.__setattr__(self, "topology", topology)
        for name in ("workers", "ring_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("stage_timeout_s", "close_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")
        if topology is Topology.SYNC and self.workers != 1:
            raise ConfigError(
                f"the sync topology runs one worker, got workers={self.workers}",
                hint="use topology 'single' or 'streams' to replicate workers",
            )
        if self.device not in ("auto", "cuda", "cpu"):
            raise ConfigError(f"device must be one of auto, cuda, cpu, got {self.device!r}")

    @property
    def slots_per_lane(self) -> int:
        """Slots each lane allocates: ``ring_size``, or 1 for the synchronous topology."""
        return 1 if self.topology is Topology.SYNC else self.ring_size

    @property
    def in_flight(self) -> int:
        """Most items in flight at once (``workers * slots_per_lane``)."""
        return self.workers * self.slots_per_lane

    @property
    def use_pinned(self) -> bool:
        """Whether host buffers are pinned (``pinned`` or the topology's default)."""
        return self.topology is not Topology.SYNC if self.pinned is None else self.pinned

    def describe(self) -> str:
        """A short label for tables, e.g. ``streams x2 ring4 graphs``."""
        parts = [self.topology.value]
        if self.workers > 1:
            parts.append(f"x{self.workers}")
        if self.topology is not Topology.SYNC:
            parts.append(f"ring{self.ring_size}")
        if self.cuda_graphs:
            parts.append("graphs")
        if self.launch_thread and self.topology is not Topology.SYNC:
            parts.append("launcher")
        return " ".join(parts)

    def replace(self, **changes: Any) -> PipelineConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PipelineConfig:
        """Build from a mapping (YAML/JSON/CLI); unknown keys are an error naming them."""
        return _configio.structure(data, cls)

    def to_dict(self) -> dict[str, Any]:
        """Plain values, the inverse of :meth:`from_dict`."""
        return _configio.unstructure(self)


_configio.register_class(PipelineConfig, name="PipelineConfig")
