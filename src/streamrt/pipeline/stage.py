"""What a pipeline is made of: stages, lanes, slots, results, and the workload protocol.

A **stage** is a function ``fn(slot, item, stream)`` that enqueues its work for one item on
``stream``: torch ops issued inside land on that stream (it is current), and for a host stream
the function runs inside that stream's worker thread. A stage must not synchronise with the host
(no ``.item()``, no ``.cpu()`` on pinned-less tensors) or it stalls the thread that enqueues
everything else.

A **slot** is one pre-allocated set of buffers (pinned input, device tensors between stages,
pinned output), filled by the workload's ``setup_slot`` once. Item ``k`` of lane ``w`` uses slot
``(k // workers) % ring_size`` of that lane, so the steady state allocates nothing.

A **lane** is one complete pipeline: its streams and per-lane state such as the engine's
execution context (one context per lane: a context serves one stream at a time).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamrt.device.base import Device, Stream
from streamrt.errors import ConfigError, PipelineError

__all__ = ["Lane", "Result", "Slot", "Stage", "StageFn", "StageKind", "Workload"]


class StageKind(enum.Enum):
    """What a stage does, for stream placement, trace colours and resource accounting."""

    H2D = "h2d"  # host-to-device copy (on a device stream; uses the H2D copy engine)
    COMPUTE = "compute"  # kernels (on a device stream; uses the SMs)
    D2H = "d2h"  # device-to-host copy (on a device stream; uses the D2H copy engine)
    HOST = "host"  # host work such as decode, encode, callbacks (on a host stream)


StageFn = Callable[["Slot", int, Stream], None]
"""``fn(slot, item, stream)``: enqueue this stage's work for ``item`` on ``stream``."""


@dataclass(frozen=True)
class Stage:
    """One step of the per-item chain.

    Attributes:
        name: unique within a pipeline; names trace spans, NVTX ranges and errors.
        fn: the stage function (see the module docstring).
        kind: a :class:`StageKind` (or its value); ``HOST`` stages run on host streams.
        stream: stream group; stages with the same group share one stream in the ``streams``
            topology (default: the stage's own name, i.e. one stream per stage). Consecutive
            stages on one stream need no event between them.
        graphable: static-shape work that may be captured as a CUDA graph per slot. Such a stage
            must not depend on ``item`` and may only touch buffers that ``setup_slot`` (or an
            earlier graphable stage) created; it is called with ``item == -1`` while capturing.
    """

    name: str
    fn: StageFn
    kind: StageKind = StageKind.COMPUTE
    stream: str | None = None
    graphable: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a stage needs a non-empty name")
        if not callable(self.fn):
            raise ConfigError(f"stage '{self.name}': fn must be callable, got {type(self.fn).__name__}")
        if not isinstance(self.kind, StageKind):
            try:
                object.__setattr__(self, "kind", StageKind(str(self.kind).lower()))
            except ValueError:
                allowed = ", ".join(k.value for k in StageKind)
                raise ConfigError(
                    f"stage '{self.name}': kind must be one of {allowed}, got {self.kind!r}"
                ) from None
        if self.graphable and self.kind is StageKind.HOST:
            raise ConfigError(f"stage '{self.name}': a host stage cannot be captured as a CUDA graph")

    @property
    def on_host(self) -> bool:
        """Whether the stage runs on a host stream."""
        return self.kind is StageKind.HOST

    @property
    def group(self) -> str:
        """The stream group (``stream`` or the stage name)."""
        return self.stream or self.name


@dataclass(eq=False)
class Lane:
    """One replicated worker: a stream per stage (shared where grouped) and per-lane state.

    ``state`` holds what ``setup_lane`` creates, typically ``state["context"]``, the engine's
    execution context used by this lane's engine stage only. ``launcher`` is the host stream that
    launches the CUDA stages following a host stage (``PipelineConfig.launch_thread``), or None.
    """

    index: int
    device: Device
    streams: tuple[Stream, ...]
    state: dict[str, Any] = field(default_factory=dict)
    launcher: Stream | None = None

    @property
    def unique_streams(self) -> list[Stream]:
        """The lane's streams, each once, in stage order."""
        seen: dict[int, Stream] = {}
        for stream in self.streams:
            seen.setdefault(id(stream), stream)
        return list(seen.values())


@dataclass(eq=False)
class Slot:
    """One entry of a lane's ring: the buffers one in-flight item uses.

    ``slot["name"]`` reads and writes :attr:`buffers`. ``input`` is the value given to
    ``submit()``; stages may leave a host-side result in ``output`` (what the default collector
    returns).
    """

    index: int
    lane: Lane
    device: Device
    pinned: bool
    buffers: dict[str, Any] = field(default_factory=dict)
    input: Any = None
    output: Any = None

    def __getitem__(self, name: str) -> Any:
        try:
            return self.buffers[name]
        except KeyError:
            raise PipelineError(
                f"slot has no buffer '{name}'; buffers: {sorted(self.buffers)}",
                hint="allocate it in the workload's setup_slot",
            ) from None

    def __setitem__(self, name: str, value: Any) -> None:
        self.buffers[name] = value

    def __contains__(self, name: object) -> bool:
        return name in self.buffers


@dataclass(frozen=True)
class Result:
    """The outcome of one item, delivered in input order.

    Attributes:
        item: the index ``submit()`` returned.
        value: what the collector returned (None when the item failed).
        error: the :class:`~streamrt.errors.StageError` that failed the item, or None.
        latency_s: host time from ``submit()`` to the result being collected.
    """

    item: int
    value: Any
    error: PipelineError | None = None
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> Any:
        """The value, or raise the item's error."""
        if self.error is not None:
            raise self.error
        return self.value


class Workload(Protocol):
    """Everything a pipeline needs besides its configuration (see ``Pipeline.from_workload``)."""

    def stages(self) -> Sequence[Stage]:
        """The stages, in per-item order."""
        ...

    def setup_lane(self, lane: Lane) -> None:
        """Create per-lane state, e.g. ``lane.state["context"] = engine.create_context()``."""
        ...

    def setup_slot(self, slot: Slot) -> None:
        """Allocate the slot's buffers (``slot.pinned`` says whether host buffers are pinned)."""
        ...

    def collect(self, slot: Slot, item: int) -> Any:
        """Turn a finished slot into the item's result; copy out, the slot is reused next."""
        ...
