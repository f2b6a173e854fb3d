"""Model instances: each one an execution context, a stream and a worker thread of its own.

An instance runs one batch at a time (Triton's rule: instance count = concurrent executions of
a model). Batches of one model on different instances overlap: on the GPU each instance enqueues
on its own CUDA stream; on the CPU each worker thread runs the engine while others do too. With
``STREAMRT_INSTANCE_LANES=2`` an instance takes a second batch while one runs (its *lanes*,
:func:`default_lanes`): on the GPU the second is gathered on the host and copied to the device on a
copy stream of its lane, and the instance's stream waits for that copy before the engine runs it, so
the gather and the copy of the next batch overlap the engine instead of following it (one lane by
default: measured no faster on the H200).

Data path of a batch, with as few host copies as the wire allows:

The copies are the device layer's staging path (:mod:`streamrt.device.staging`), the one the
pipeline workloads use too; this module decides which requests go where.

* **Inputs**: each request's tensors are zero-copy views of the request body. They are
  concatenated straight into a per-instance input slot (:class:`~streamrt.device.staging.HostSlots`:
  pinned host memory when the engine is on CUDA, then asynchronous H2D copies on the instance's
  stream). A large batch is copied in pieces on the process's copy threads
  (:class:`~streamrt.device.row_copier.RowCopier`), each piece's H2D copy enqueued as it lands.
  A batch of one request on a CPU engine skips the slot and runs on the view itself. On a CUDA
  engine, requests whose tensors lie in page-locked memory (a front-end process's arena, which
  the engine process offers to :data:`~streamrt.device.staging.PINNABLE`) skip the slot too: each is
  copied straight into the device batch (:func:`~streamrt.device.staging.rows_to_device`; on by default,
  ``STREAMRT_DIRECT_HOST_COPIES=0`` turns it off).
* **Outputs**: CUDA outputs are copied asynchronously into freshly taken pinned buffers (torch's
  caching host allocator recycles them), then split into per-request views; the front end's
  serialisation is the only further copy. CPU outputs are split as views. Before the split, the
  instance's :class:`~streamrt.serve.execution.integrity.OutputCheck` makes sure every output has the batch's
  rows (and the config's dtype and dims): a batch that fails it fails for every request in it.
* **Device outputs (opt-in)**: a request whose inputs come as :class:`DeviceOutputs` (an ensemble
  step whose outputs feed only other steps) gets its outputs from a CUDA instance as
  :class:`~streamrt.serve.wire.shared_memory.DeviceTensor` copies of the engine's outputs made on the
  device (the engine's own output buffers, CUDA graphs' static ones, are overwritten by the
  instance's next batch), with no copy to the host; the instance still waits for its stream, so
  the tensors are complete when handed on, and the next step's CUDA instance gathers them on the
  device. CPU instances ignore the mark. Outputs named in ``Instance.device_outputs`` (the
  sequence batcher's states) stay on the device for every request, copied the same way.

Example:
    >>> group = InstanceGroup.create(engine, config, max_batch_size=8)   # doctest: +SKIP
    >>> group.instances[0].submit([{"x": x}], done=print)                # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from streamrt._env import env_switch
from streamrt.backends.base import Engine
from streamrt.device import (
    Device,
    Event,
    HostBatch,
    HostSlots,
    Stream,
    device_scope,
    get_device,
    split_rows,
    stream_scope,
    to_device,
    to_host,
)
from streamrt.device.row_copier import RowCopier, shared_copier
from streamrt.device.staging import DIRECT_COPIES, rows_to_device, stage_to_device
from streamrt.errors import ConfigError, InferenceError, StreamRTError
from streamrt.serve.configs.config import InstanceGroupConfig
from streamrt.serve.execution.integrity import OutputCheck
from streamrt.serve.execution.placement import place_instances, resolved_groups, visible_gpus
from streamrt.serve.wire.shared_memory import DeviceTensor
from streamrt.types import DType

if TYPE_CHECKING:
    from streamrt.serve.execution.rate_limiter import RateLimiter, Ticket

__all__ = ["BatchResult", "DeviceEngines", "DeviceOutputs", "Instance", "InstanceGroup", "default_lanes"]

log = logging.getLogger(__name__)

Inputs = Mapping[str, np.ndarray]

# Input slots kept per instance for distinct (input, dtype, item shape) keys; older ones are dropped.
_MAX_SLOT_KEYS = 8


class DeviceOutputs(dict[str, Any]):
    """A request's inputs, marked: its outputs may stay on the device (see the module docstring)."""


@dataclass
class BatchResult:
    """Per-request outputs of one batch and how long its phases took (ns); ``errors`` maps the index
    of a request that failed on its own (the others of the batch succeeded) to its error."""

    outputs: list[dict[str, np.ndarray]]
    rows: int
    input_ns: int
    infer_ns: int
    output_ns: int
    errors: dict[int, BaseException] = field(default_factory=dict)


class Instance:
    """One execution context + stream + worker; runs the batches it is given, one at a time.

    Args:
        name: for logs and thread names (``<model>_<version>_<index>``).
        engine: the loaded engine (shared by the instances of a model version on the same device).
        device: the device layer's device the engine runs on (``CudaDevice(n)`` for GPU n).
        batched: the model has a batch dimension (batches are concatenated along axis 0).
        max_batch_size: rows of the input slots.
        check: checks every batch's outputs before they are split (None: no check, for tests that
            show what it catches).
        gpu: the GPU index it runs on (None on the CPU), for statistics and logs.
        copier: gathers large batches into the input slots (default: the process's
            :func:`~streamrt.device.row_copier.shared_copier`, ``$STREAMRT_STAGING_THREADS`` threads).
        lanes: batches taken at once (None: :func:`default_lanes`).
    """

    def __init__(
        self, name: str, engine: Engine, device: Device, *, batched: bool, max_batch_size: int,
        check: OutputCheck | None = None, gpu: int | None = None, copier: RowCopier | None = None,
        lanes: int | None = None,
    ) -> None:
        self.name = name
        self.gpu = gpu
        self.check = check
        self.engine = engine
        self.device = device
        self.batched = batched
        self.max_batch_size = max(1, max_batch_size)
        self.context = engine.create_context()
        self.stream: Stream = device.stream(name)
        self._cuda = device.is_cuda
        self.lanes = default_lanes() if lanes is None else lanes
        """Batches this instance takes at once: each lane gathers and stages its batch while another lane's runs
        (:func:`default_lanes`); the engine still runs one batch at a time, in the order they were staged."""
        if self.lanes < 1:
            raise ConfigError(f"instance {name}: lanes must be 1 or more, not {self.lanes}")
        self._lanes = [self._lane(i) for i in range(self.lanes)]
        self._lane_lock = threading.Lock()
        self._engine_lock = threading.Lock()  # the context runs (enqueues) one lane's batch at a time
        self.device_outputs: frozenset[str] = frozenset()
        """Outputs a CUDA instance hands back as device tensors (the sequence batcher's states)."""
        self.copier = copier if copier is not None else shared_copier()
        """Copies large gathers into the input slots in pieces on its threads (the process's, by default;
        None: one gather, then one copy)."""
        self.rate_limit: Ticket | None = None  # set when the server's rate limiter is on

    def _lane(self, index: int) -> _Lane:
        name, device = f"{self.name}-lane{index}" if self.lanes > 1 else self.name, self.device
        # A host stream is its own worker; a CUDA stream needs a thread that enqueues onto it, and so do the
        # lanes of a host instance (they share its context).
        worker = device.host_stream(f"{name}-worker") if self._cuda or self.lanes > 1 else self.stream
        # One lane stages on the instance's stream; several stage on streams of their own, which the instance's
        # waits for (an event) before it runs their batch: a copy overlaps the engine.
        stream = device.stream(f"{name}-copy") if self._cuda and self.lanes > 1 else self.stream
        slots = HostSlots(device, self.max_batch_size, max_keys=_MAX_SLOT_KEYS)
        return _Lane(worker, stream, slots, _gpu_marks() if self._cuda else None)

    def __repr__(self) -> str:
        return f"Instance({self.name!r}, {self.device!r})"

    def submit(self, requests: Sequence[Inputs], done: Callable[[BatchResult | BaseException], None]) -> None:
        """Run ``requests`` as one batch on the least busy lane's worker; ``done`` gets the result or the error.

        ``done`` runs on the worker thread and is called exactly once. More batches than :attr:`lanes` at once
        queue on the lanes' workers.
        """
        with self._lane_lock:
            lane = min(self._lanes, key=lambda each: each.queued)
            lane.queued += 1

        def job() -> None:
            try:
                result: BatchResult | BaseException = self.run(requests, lane)
            except BaseException as exc:
                result = exc
            with self._lane_lock:
                lane.queued -= 1
            done(result)

        lane.worker.launch(job)

    def run(self, requests: Sequence[Inputs], lane: _Lane | None = None) -> BatchResult:
        """Run one batch synchronously in the calling thread (a lane's worker, or warm-up on the first lane).

        Raises:
            OutputMismatchError: an output does not have the batch's rows, or the config's dtype or dims.
            InferenceError: the engine failed.
        """
        lane = lane or self._lanes[0]
        marks = lane.marks
        t0 = time.perf_counter_ns()
        rows = [self._rows(r) for r in requests]
        inputs = self._gather(requests, lane)
        t1 = time.perf_counter_ns()
        wanted = [self._cuda and isinstance(r, DeviceOutputs) for r in requests]
        outputs = self._execute(inputs, lane, on_device=any(wanted))
        t2 = time.perf_counter_ns()
        if self.check is not None:
            self.check(outputs, sum(rows))
        if len(requests) == 1 and wanted[0] == any(wanted):
            split = [outputs]
        else:
            keep = self.device_outputs
            split = split_rows(outputs, rows, lambda k, v, i, a, b: _rows_of(v, a, b, wanted[i] or k in keep))
        t3 = time.perf_counter_ns()
        if marks is None:
            return BatchResult(split, sum(rows), t1 - t0, t2 - t1, t3 - t2)
        # On the GPU the host only enqueues: Triton's split is read from the streams' own clock instead (input:
        # until the batch is on the device, the host gather included; infer: the engine, from when it started on
        # this batch; output: the copies back and the split). A lane's wait for the engine counts nowhere.
        gpu = [int(marks[a].elapsed_ms(marks[b]) * 1e6) for a, b in ((0, 1), (2, 3), (3, 4))]
        return BatchResult(split, sum(rows), gpu[0], gpu[1], gpu[2] + t3 - t2)

    def execute(self, requests: Sequence[Inputs]) -> dict[str, np.ndarray]:
        """Run ``requests`` as one batch and return the outputs of all its rows, unchecked and unsplit
        (the load-time probe reads their shapes)."""
        lane = self._lanes[0]
        return self._execute(self._gather(requests, lane), lane)

    def _rows(self, request: Inputs) -> int:
        return next(iter(request.values())).shape[0] if self.batched else 1

    def _execute(self, inputs: dict[str, Any], lane: _Lane, on_device: bool = False) -> dict[str, Any]:
        try:
            return self._infer(inputs, lane, on_device)
        except StreamRTError:
            raise
        except Exception as exc:
            raise InferenceError(f"instance {self.name}: {type(exc).__name__}: {exc}") from exc

    def _gather(self, requests: Sequence[Inputs], lane: _Lane) -> dict[str, Any]:
        """The batch's inputs, staged on ``lane``'s stream between its first two timing events (on CUDA: the
        engine's stream waits for the second before it reads them, :meth:`_infer`)."""
        if len(requests) == 1 and not self._cuda:
            return {k: np.asarray(v) for k, v in requests[0].items()}  # a DeviceTensor (CUDA shm) comes to the host
        if lane.marks is None:
            return self._stage(requests, lane.stream, lane.slots)
        lane.stream.record(lane.marks[0])
        gathered = self._stage(requests, lane.stream, lane.slots)
        lane.stream.record(lane.marks[1])
        return gathered

    def _stage(self, requests: Sequence[Inputs], stream: Stream, slots: HostSlots) -> dict[str, Any]:
        gathered: dict[str, Any] = {}
        for name in requests[0]:
            arrays = [r[name] for r in requests]
            if self._cuda and any(isinstance(a, DeviceTensor) for a in arrays):
                gathered[name] = self._gather_on_device(arrays, stream)
                continue
            direct = rows_to_device(arrays, self.device, stream) if self._cuda and DIRECT_COPIES else None
            if direct is not None:  # read by the copy until the batch's end, when the lane waits for the instance
                gathered[name] = direct
                continue
            if self.batched:  # into the lane's slot (more rows than it holds: a fresh array)
                gathered[name] = stage_to_device(slots, name, arrays, self.device, stream, self.copier)
                continue
            host = HostBatch(np.concatenate(arrays) if len(arrays) > 1 else np.ascontiguousarray(arrays[0]))
            gathered[name] = to_device(host, self.device, stream)
        return gathered

    def _gather_on_device(self, arrays: Sequence[Any], stream: Stream) -> Any:
        """CUDA shared-memory inputs: one device-to-device copy into the batch (no host round trip)."""
        import torch

        with stream_scope(stream):
            here = self.device.torch_device
            # A tensor on another GPU (an ensemble step's output from an instance there) is copied peer to peer.
            parts = [(a.tensor if a.tensor.device == here else a.tensor.to(here, non_blocking=True))
                     if isinstance(a, DeviceTensor) else
                     torch.from_numpy(np.ascontiguousarray(a)).to(here, non_blocking=True)
                     for a in arrays]
            if len(parts) == 1 and parts[0].data_ptr() % 64 == 0:
                return parts[0]  # the region itself: leased until the request is answered; compiled kernels
            return torch.cat(parts)  # want aligned inputs, so an unaligned offset gets a copy

    def _infer(self, inputs: dict[str, Any], lane: _Lane, on_device: bool = False) -> dict[str, Any]:
        # The model validated every request once (ServedModel.validate); the engine does not again.
        if not self._cuda:
            with self._engine_lock:
                raw = self.context.infer(inputs, self.stream, check_inputs=False)
            return {k: v if isinstance(v, np.ndarray) else np.asarray(v) for k, v in raw.items()}
        marks = lane.marks
        assert marks is not None
        with self._engine_lock, stream_scope(self.stream):
            # The engine runs lanes' batches in the order they get here; a lane's inputs were staged on its own
            # stream, read here once that stream gets past them. The batch after this one may be staged meanwhile.
            if lane.stream is not self.stream:
                self.stream.wait(marks[1])
            self.stream.record(marks[2])
            raw = self.context.infer(inputs, self.stream, check_inputs=False)
            self.stream.record(marks[3])
            host: dict[str, Any] = {}
            for key, value in raw.items():
                if isinstance(value, np.ndarray):
                    host[key] = value
                elif value.is_cuda and (on_device or key in self.device_outputs):
                    # Cloned (a device-to-device copy): engine outputs are its own buffers (CUDA graphs'
                    # static outputs), which the instance's next batch overwrites while the next
                    # ensemble step or sequence step may not have read them yet.
                    host[key] = DeviceTensor(value.clone(), DType.from_any(value.dtype).numpy, tuple(value.shape))
                else:
                    host[key] = to_host(value, self.stream)  # CUDA: a fresh pinned buffer, copied on the stream
            self.stream.record(marks[4])
        # the lane's worker waits (the inputs it staged stay alive until then); the event loop does not
        marks[4].synchronize()
        return {k: v if isinstance(v, (np.ndarray, DeviceTensor)) else v.numpy() for k, v in host.items()}

    def close(self, timeout: float | None = None) -> None:
        """Finish queued work (up to ``timeout``), stop the worker and release the context."""
        for lane in self._lanes:
            lane.worker.close(timeout=timeout)
        for lane in self._lanes:
            if lane.stream is not self.stream:
                lane.stream.close(timeout=timeout)
        if self._lanes[0].worker is not self.stream:  # else closed as the worker
            self.stream.close(timeout=timeout)
        self.context.close()
        for lane in self._lanes:
            lane.slots.clear()
        if self.rate_limit is not None:
            self.rate_limit.close()


BLOCKING_SYNC = env_switch("STREAMRT_BLOCKING_SYNC", False)
"""Whether a GPU instance's thread sleeps while it waits for its batch (``cudaEventBlockingSync``) instead of
CUDA's default for a busy host, spinning on a core (``STREAMRT_BLOCKING_SYNC=1``). Two instances of a 7 ms
batch spin two cores that the front ends, the clients and the gathers of a host transport want; a sleeping
thread wakes some microseconds later. Off: on the H200 (2026-12-05) it served ResNet-50 over the host transports
at 0.91x the spinning default (docs/benchmarks/2026-12-05-h200-s4.md)."""


def default_lanes() -> int:
    """Batches an instance takes at once: ``$STREAMRT_INSTANCE_LANES``, else 1.

    With one lane an instance gathers a batch, copies it to the device, runs it and copies its outputs back,
    then takes the next. With two, a GPU instance of a batched model gathers and stages the next batch on a copy
    stream of its own while the first runs. That was meant for the host transports, whose gather and copy took
    as long as ResNet-50's engine on the H200 (5-7 ms each per batch of 64 images); measured on the H200 on
    2026-12-05 (docs/benchmarks/2026-12-05-h200-s5.md) two lanes were 0.73-1.13x one lane without the direct
    copies and 0.85-1.03x with them, so one lane stays the default. A CPU instance takes lanes too when asked (its
    lanes share the context, one batch in it at a time), to no gain expected.
    """
    configured = os.environ.get("STREAMRT_INSTANCE_LANES", "").strip()
    if not configured:
        return 1
    try:
        lanes = int(configured)
    except ValueError:
        lanes = 0
    if lanes < 1:
        raise ConfigError(f"STREAMRT_INSTANCE_LANES must be a whole number of 1 or more, not '{configured}'")
    return lanes


@dataclass(eq=False)
class _Lane:
    """One batch in flight on an instance: the thread that runs it, the stream it stages its inputs on (the
    instance's own with one lane), its input slots and its timing events; ``queued``: batches given to it and
    not yet done."""

    worker: Stream
    stream: Stream
    slots: HostSlots
    marks: list[Event] | None
    queued: int = 0


def _gpu_marks() -> list[Event]:
    """Timing events a lane records every batch: before its inputs and once they are on the device (on the
    stream it stages on), then on the instance's stream when the engine starts the batch, when it is done, and
    when the outputs are on the host (reused: the lane waits for that last one every batch; it blocks instead of
    spinning with :data:`BLOCKING_SYNC`)."""
    from streamrt.device.cuda import CudaEvent

    return [*(CudaEvent(timing=True) for _ in range(4)), CudaEvent(timing=True, blocking=BLOCKING_SYNC)]


def _rows_of(value: Any, start: int, stop: int, keep_on_device: bool) -> Any:
    """Rows ``start:stop`` of a batch output; a device output goes to the host unless ``keep_on_device``."""
    if not isinstance(value, DeviceTensor):
        return value[start:stop]
    part = DeviceTensor(value.tensor[start:stop], value.dtype, (stop - start, *value.shape[1:]))
    return part if keep_on_device else np.asarray(part)


class DeviceEngines:
    """A model version's engine on each GPU its instances use: loaded once per device, shared by that
    device's instances and never across devices (an engine's weights and kernels live on one GPU).

    Args:
        primary: the engine already loaded (its specs resolve the config).
        gpu: the GPU ``primary`` was loaded on (None for a CPU engine).
        load: loads the engine again; called with the target GPU current (:func:`device_scope`), which is
            where each backend puts a plan and where the plan's compatibility check reads the GPU's model.
    """

    def __init__(self, primary: Engine, gpu: int | None = None, load: Callable[[], Engine] | None = None) -> None:
        self.primary = primary
        self._load = load
        self._by_gpu: dict[int | None, Engine] = {gpu: primary}

    def on(self, gpu: int | None) -> Engine:
        """The engine for GPU ``gpu`` (None: the CPU engine), loading it there on first use.

        Raises:
            ConfigError: no loader to put the engine on another GPU.
            PlanMismatchError: the plan was built for another GPU model than GPU ``gpu`` (with the rebuild command).
        """
        engine = self._by_gpu.get(gpu)
        if engine is not None:
            return engine
        if gpu is None or self._load is None:
            raise ConfigError(f"the engine is loaded on {self.describe()} only, not on GPU {gpu}")
        with device_scope(gpu):
            engine = self._load()
        self._by_gpu[gpu] = engine
        if engine.device_kind != self.primary.device_kind:
            raise ConfigError(f"the engine loaded on GPU {gpu} runs on {engine.device_kind}, the first one on "
                              f"{self.primary.device_kind}")
        log.info("engine %s loaded on GPU %d", engine.manifest.backend, gpu)
        return engine

    @property
    def gpus(self) -> list[int]:
        """The GPUs an engine is loaded on."""
        return sorted(g for g in self._by_gpu if g is not None)

    def describe(self) -> str:
        gpus = self.gpus
        return ", ".join(f"GPU {g}" for g in gpus) if gpus else "the CPU"

    def close(self) -> None:
        for engine in self._by_gpu.values():
            try:
                engine.close()
            except Exception:
                log.warning("closing an engine failed", exc_info=True)


class InstanceGroup:
    """All instances of one model version."""

    def __init__(self, instances: list[Instance], groups: tuple[InstanceGroupConfig, ...] = ()) -> None:
        self.instances = instances
        self.groups = groups
        """The config's groups as they were placed (:func:`~streamrt.serve.execution.placement.resolved_groups`)."""

    @classmethod
    def create(
        cls, name: str, engines: Engine | DeviceEngines, groups: Sequence[InstanceGroupConfig], *, batched: bool,
        max_batch_size: int, check: OutputCheck | None = None, limiter: RateLimiter | None = None,
        gpus: Sequence[str] | None = None,
    ) -> InstanceGroup:
        """Create every instance the config's ``instance_group`` asks for (each checks its batches with ``check``),
        each registered with ``limiter`` under its group's ``rate_limiter`` when there is one.

        Placement follows Triton (:func:`~streamrt.serve.execution.placement.place_instances`): ``count`` instances on
        each GPU a group lists, every visible GPU when it lists none. Each instance gets its own context,
        stream and pinned buffers on its own device, from that device's engine.

        Args:
            gpus: the visible GPUs' names (default: :func:`~streamrt.serve.execution.placement.visible_gpus`).

        Raises:
            ConfigError: a KIND_GPU group for a CPU engine (or the reverse), a GPU that does not exist (the
                message lists the visible ones), or rate limiter resources the server cannot give.
            PlanMismatchError: a GPU of another model than the plan was built for.
        """
        if not isinstance(engines, DeviceEngines):
            engines = DeviceEngines(engines, 0 if engines.device_kind == "cuda" else None)
        engine = engines.primary
        visible = list(visible_gpus() if gpus is None else gpus)
        placements = place_instances(groups, engine_kind=engine.device_kind, gpus=visible, model=name)
        instances: list[Instance] = []
        try:
            for placed in placements:
                on = engines.on(placed.gpu)
                device = get_device(placed.device, placed.gpu or 0)
                with device_scope(placed.gpu if len(visible) > 1 else None):
                    instances.append(
                        Instance(f"{name}_{len(instances)}", on, device, batched=batched,
                                 max_batch_size=max_batch_size, check=check, gpu=placed.gpu)
                    )
                if limiter is not None:
                    try:
                        ticket = limiter.register(instances[-1].name, groups[placed.group].rate_limiter,
                                                  device=placed.gpu or 0)
                    except ConfigError as exc:
                        raise ConfigError(f"model '{name}': {exc.message}", hint=exc.hint) from None
                    instances[-1].rate_limit = ticket
        except BaseException:
            cls(instances).close()
            raise
        if engines.gpus and len(engines.gpus) > 1:
            log.info("model '%s': %d instances on %s", name, len(instances), engines.describe())
        return cls(instances, resolved_groups(groups, placements))

    def close(self, timeout: float | None = None) -> None:
        for instance in self.instances:
            try:
                with device_scope(instance.gpu or None):  # a context is released with its GPU current
                    instance.close(timeout)
            except Exception:
                log.warning("closing instance %s failed", instance.name, exc_info=True)
