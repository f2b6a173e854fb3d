"""The sequence batcher: Triton's ``sequence_batching`` for stateful models (trackers, streaming
recognisers), in front of a model version's instances.

Requests carry a sequence id and START/END flags (:class:`~streamrt.serve.wire.protocol.SequenceFlags`).
A sequence that starts is bound to a *slot* of one instance (a backlog holds it while every slot is
taken) and keeps it until its END request has run or it stays idle for
``max_sequence_idle_microseconds``. The requests of a sequence run one at a time and in order,
since a slot belongs to one instance and an instance runs one batch at a time; a batch takes at
most one request per sequence. The rules follow Triton's ``sequence_batch_scheduler.cc``:

* **direct**: each instance has ``max_batch_size`` slots and a slot is a batch row. A batch holds
  the next request of every slot that has one (after ``max_queue_delay_microseconds`` when fewer
  than ``minimum_slot_utilization`` of the slots have one). When the model has a READY control,
  the rows keep their slot positions and empty slots below the last used one are filled with
  zero rows marked not ready, as Triton does; otherwise the batch is packed.
* **oldest**: each instance has ``max_candidate_sequences`` slots; the batch is cut, dynamic
  batcher style, from the oldest pending requests of those sequences (preferred sizes, delay).

Per row the batcher fills the control inputs (START, END, READY, CORRID, in the config's types
and false/true values) and the implicit states: each state input gets the sequence's state
(zeros of the configured dims at START), and the state output of the step becomes the next state.
States of CUDA instances stay on the device as torch tensors (the instance keeps those outputs
on the GPU); CPU states are NumPy arrays. A sequence's state is dropped at END and at idle expiry.

Errors are Triton's: a request with an id the batcher does not know and no START is refused (400,
"must specify the START flag"), so is a request that names no sequence or has more than one row.
Everything runs on the server's event loop, like :mod:`streamrt.serve.scheduling.scheduler`; the loop,
the batch launch and the shutdown are :class:`~streamrt.serve.scheduling.loop.SchedulerLoop`'s.

Example:
    >>> sched = SequenceScheduler("acc:1", instances, config, stats)                    # doctest: +SKIP
    >>> await sched.submit({"x": x}, flags=SequenceFlags(7, start=True), key=(), rows=1) # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from streamrt.device import stream_scope
from streamrt.errors import (
    ConfigError,
    InferenceError,
    ModelNotReadyError,
    OutputMismatchError,
    RequestError,
)
from streamrt.serve.configs.config import ModelConfig, SequenceBatchingConfig, SequenceControl
from streamrt.serve.execution.instances import BatchResult, Instance, InstanceGroup
from streamrt.serve.observability.stats import ModelStats
from streamrt.serve.observability.tracing import RequestTrace
from streamrt.serve.scheduling.loop import Job, SchedulerLoop
from streamrt.serve.wire.protocol import SequenceFlags
from streamrt.serve.wire.shared_memory import DeviceTensor
from streamrt.types import DType, TensorSpec

__all__ = ["SequenceScheduler", "check_sequence_io", "sequence_warmup_inputs"]

log = logging.getLogger(__name__)

Outputs = dict[str, Any]

_INT_RANGES = {"int32": (-(2**31), 2**31), "int64": (-(2**63), 2**63), "uint32": (0, 2**32), "uint64": (0, 2**64)}


# --- the model's side: which inputs and outputs the batcher owns ------------------------------------


def check_sequence_io(config: ModelConfig, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
    """Check that every control and state of ``config.sequence_batching`` is an engine input (and
    output) of the right type and dims (the engine's specs include the batch dimension when batched).

    Raises:
        ConfigError: a control or state that the engine lacks, or whose type or dims differ.
    """
    sb = config.sequence_batching
    if sb is None:
        return
    where = f"model '{config.name}' sequence_batching"
    batched = bool(config.max_batch_size)
    for size in sb.preferred_batch_size:
        if size > (config.max_batch_size or 1):
            raise ConfigError(f"{where}: oldest preferred_batch_size {size} exceeds max_batch_size "
                              f"{config.max_batch_size or 1}")
    by_in = {s.name: s for s in inputs}
    by_out = {s.name: s for s in outputs}
    given = {t.name for t in config.input}
    for name in sb.hidden_inputs:
        if name in given:
            raise ConfigError(f"{where}: '{name}' is a control or state input; leave it out of 'input' "
                              "(the batcher fills it, clients never send it)")
    checks: list[tuple[str, DType, tuple[int, ...], dict[str, TensorSpec], str]] = [
        (c.name, c.data_type, (1,), by_in, "control input") for c in sb.controls]
    for s in sb.states:
        checks += [(s.input_name, s.data_type, s.dims, by_in, "state input"),
                   (s.output_name, s.data_type, s.dims, by_out, "state output")]
    for name, dtype, dims, specs, what in checks:
        spec = specs.get(name)
        if spec is None:
            raise ConfigError(f"{where}: {what} '{name}' is not in the engine; it has {', '.join(specs)}")
        if spec.dtype is not dtype:
            raise ConfigError(f"{where}: {what} '{name}' is TYPE_{dtype.kserve} in the config but "
                              f"TYPE_{spec.dtype.kserve} in the engine")
        shape = tuple(spec.shape[1:] if batched else spec.shape)
        if len(shape) != len(dims) or any(e not in (-1, d) and d != -1 for d, e in zip(dims, shape, strict=True)):
            raise ConfigError(f"{where}: {what} '{name}' has dims {list(dims)} in the config but {list(shape)} "
                              "in the engine (batch dimension excluded)",
                              hint="control inputs have dims [1]; a state's dims are the engine's")


def _control_value(control: SequenceControl, value: bool | int | str, batched: bool) -> np.ndarray:
    shape = (1, 1) if batched else (1,)
    if control.kind != "CONTROL_SEQUENCE_CORRID":
        return np.full(shape, control.false_true[int(bool(value))], dtype=control.data_type.numpy)
    if control.data_type.kserve == "BYTES":
        out = np.empty(shape, dtype=object)
        out.flat[0] = str(value).encode() if not isinstance(value, bytes) else value
        return out
    return np.full(shape, value, dtype=control.data_type.numpy)


def sequence_warmup_inputs(config: ModelConfig, rows: int) -> dict[str, np.ndarray]:
    """Zero control and state inputs for ``rows`` rows (warm-up and the load-time batch probe:
    READY false, so a model that honours it leaves its state alone)."""
    sb = config.sequence_batching
    if sb is None:
        return {}
    batched = bool(config.max_batch_size)
    out = {}
    for c in sb.controls:
        one = _control_value(c, "" if c.data_type.kserve == "BYTES" and c.kind.endswith("CORRID") else 0, batched)
        out[c.name] = np.concatenate([one] * rows) if batched else one
    for s in sb.states:
        out[s.input_name] = np.zeros(((rows,) if batched else ()) + s.start_dims, dtype=s.data_type.numpy)
    return out


# --- the scheduler ------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Step:
    """One queued request of a sequence."""

    inputs: Mapping[str, Any]
    flags: SequenceFlags
    key: Hashable
    future: asyncio.Future[Outputs]
    enqueued_ns: int
    enqueued: float
    trace: RequestTrace | None = None


@dataclass(eq=False)
class _Sequence:
    id: int | str
    steps: deque[_Step] = field(default_factory=deque)
    slot: _Slot | None = None
    state: dict[str, Any] | None = None
    last_active: float = 0.0
    running: bool = False


@dataclass(eq=False)
class _Slot:
    owner: _Batcher
    position: int
    sequence: _Sequence | None = None


@dataclass(eq=False)
class _Batcher:
    """One instance and its slots."""

    instance: Instance
    slots: list[_Slot] = field(default_factory=list)
    busy: bool = False

    @property
    def free(self) -> int:
        return sum(s.sequence is None for s in self.slots)


Row = tuple[_Sequence, _Step] | None
"""A batch row: a sequence's step, or None for a filler (direct strategy with a READY control)."""


class SequenceScheduler(SchedulerLoop[list[Row]]):
    """Sequence slots + backlog + batch forming + instance dispatch for one model version.

    Same surface as :class:`~streamrt.serve.scheduling.scheduler.ModelScheduler` (``submit``, ``pending``,
    ``close``); ``submit`` takes the request's :class:`SequenceFlags` as well.

    Args:
        name: ``<model>:<version>`` for messages.
        instances: the version's instances (idle at start).
        config: the resolved model config (its ``sequence_batching`` is set).
        stats: counters to update (queue time, batches).
    """

    _QUEUED = " sequence requests"

    def __init__(self, name: str, instances: InstanceGroup, config: ModelConfig, stats: ModelStats) -> None:
        assert config.sequence_batching is not None
        self.model = config.name
        self.config: SequenceBatchingConfig = config.sequence_batching
        self._batched = bool(config.max_batch_size)
        self._max_rows = config.max_batch_size or 1
        sb = self.config
        count = self._max_rows if sb.strategy == "direct" else (sb.max_candidate_sequences or self._max_rows)
        self._batchers = []
        for instance in instances.instances:
            batcher = _Batcher(instance)
            batcher.slots = [_Slot(batcher, i) for i in range(count)]
            self._batchers.append(batcher)
            instance.device_outputs = frozenset(sb.hidden_outputs)  # CUDA: states stay on the device
        self._controls = {c.kind: c for c in sb.controls}
        corrid = self._controls.get("CONTROL_SEQUENCE_CORRID")
        self._corrid_type = corrid.data_type.numpy.name if corrid is not None and corrid.data_type.kserve != "BYTES" \
            else None
        self._fill = sb.strategy == "direct" and self._batched and "CONTROL_SEQUENCE_READY" in self._controls
        self._preferred = frozenset(sb.preferred_batch_size or (self._max_rows,))
        self._delay = sb.max_queue_delay_microseconds / 1e6
        self._idle_s = sb.max_sequence_idle_microseconds / 1e6
        self._live: dict[int | str, _Sequence] = {}  # accepting requests (START seen, END not yet)
        self._held: set[_Sequence] = set()  # holding a slot or waiting for one
        self._backlog: deque[_Sequence] = deque()
        super().__init__(name, instances, stats, task=f"sequence-scheduler-{name}")

    @property
    def pending(self) -> int:
        """Requests waiting to run (``nv_inference_pending_request_count``)."""
        return sum(len(s.steps) for s in self._held)

    @property
    def sequences(self) -> int:
        """Sequences holding a slot or waiting in the backlog."""
        return len(self._held)

    async def submit(
        self, inputs: Mapping[str, Any], *, flags: SequenceFlags, key: Hashable, trace: RequestTrace | None = None,
    ) -> Outputs:
        """Queue one request of a sequence and wait for its outputs (state outputs removed).

        Raises:
            RequestError: an unknown sequence without START, or an id the CORRID control cannot hold.
            ModelNotReadyError: the model is being unloaded.
            InferenceError: the batch it ran in failed (the sequence's state stays as it was).
        """
        if self._closing:
            raise ModelNotReadyError(f"model '{self.name}' is unloading and accepts no new requests")
        self._check_id(flags.id)
        sequence = self._live.get(flags.id)
        if sequence is None:
            if not flags.start:
                raise RequestError(
                    f"inference request for sequence {flags.id} to model '{self.model}' must specify the START "
                    "flag on the first request of the sequence",
                    hint="send sequence_start=True first; a sequence is forgotten after its END or after "
                         f"{self._idle_s * 1e3:.0f} ms idle (max_sequence_idle_microseconds)")
            sequence = _Sequence(flags.id)
            self._live[flags.id] = sequence
            self._held.add(sequence)
            self._backlog.append(sequence)
        elif flags.start:
            log.warning("model '%s': sequence %s started again before it ended; its state restarts",
                        self.name, flags.id)
        future: asyncio.Future[Outputs] = self._loop.create_future()
        step = _Step(inputs, flags, key, future, time.perf_counter_ns(), time.monotonic(), trace)
        if trace is not None:
            trace.mark("QUEUE_START", step.enqueued_ns)
        sequence.steps.append(step)
        sequence.last_active = step.enqueued
        if flags.end:
            del self._live[flags.id]  # a later START with this id begins a new sequence
        self._wakeup.set()
        return await future

    def _check_id(self, sequence_id: int | str) -> None:
        if self._corrid_type is None:
            return
        if isinstance(sequence_id, str):
            raise RequestError(f"model '{self.model}' takes integer sequence ids (its CORRID control is "
                               f"{self._corrid_type}), got the string id {sequence_id!r}")
        low, high = _INT_RANGES[self._corrid_type]
        if not low <= sequence_id < high:
            raise RequestError(f"sequence id {sequence_id} does not fit the {self._corrid_type} CORRID control "
                               f"of model '{self.model}'")

    # --- the loop -----------------------------------------------------------------------------------

    def _step(self, now: float) -> list[float]:
        """Release idle sequences, bind backlogged ones to free slots, form and dispatch a batch on
        every idle instance; wake at a batching delay's end or the next idle expiry."""
        self._expire_idle(now)
        self._assign_slots()
        wakes: list[float] = []
        for batcher in self._batchers:
            if batcher.busy:
                continue
            rows, wake = self._form(batcher, now)
            if rows:
                try:
                    self._dispatch(batcher, rows)
                except Exception as exc:  # e.g. no device memory for a state: fail the batch, keep serving
                    log.warning("model '%s': a batch could not be prepared: %s", self.name, exc)
                    self._complete(batcher, rows, False, InferenceError(
                        f"model '{self.model}': the batch could not be prepared: {type(exc).__name__}: {exc}"))
            elif wake is not None:
                wakes.append(wake)
        idle = [s.last_active + self._idle_s for s in self._held if not s.steps and not s.running]
        return wakes + ([min(idle)] if idle else [])

    def _jobs(self, batch: list[Row]) -> list[Job]:
        return [row[1] for row in batch if row is not None]

    def _drain(self) -> list[Job]:
        steps: list[Job] = []
        for sequence in list(self._held):
            steps += sequence.steps
            sequence.steps.clear()
            self._release(sequence)
        return steps

    def _expire_idle(self, now: float) -> None:
        for sequence in [s for s in self._held if not s.steps and not s.running]:
            if now - sequence.last_active >= self._idle_s:
                log.info("model '%s': sequence %s was idle for more than %.0f ms; its slot and state are released",
                         self.name, sequence.id, self._idle_s * 1e3)
                self._release(sequence)

    def _release(self, sequence: _Sequence) -> None:
        if sequence.slot is not None:
            sequence.slot.sequence = None
            sequence.slot = None
        sequence.state = None
        self._held.discard(sequence)
        if self._live.get(sequence.id) is sequence:
            del self._live[sequence.id]
        self._wakeup.set()

    def _assign_slots(self) -> None:
        """Bind backlogged sequences to free slots, on the instance with the most free slots."""
        while self._backlog:
            batcher = max(self._batchers, key=lambda b: b.free, default=None)
            if batcher is None or not batcher.free:
                return
            sequence = self._backlog.popleft()
            if sequence not in self._held:
                continue
            slot = next(s for s in batcher.slots if s.sequence is None)
            slot.sequence, sequence.slot = sequence, slot

    def _form(self, batcher: _Batcher, now: float) -> tuple[list[Row] | None, float | None]:
        """The next batch of ``batcher``'s slots, or when to look again (None: nothing pending)."""
        ready = [s for s in batcher.slots if s.sequence is not None and s.sequence.steps]
        if not ready:
            return None, None
        ready.sort(key=lambda s: s.sequence.steps[0].enqueued)  # type: ignore[union-attr]
        head = ready[0].sequence.steps[0]  # type: ignore[union-attr]
        ready = [s for s in ready if s.sequence.steps[0].key == head.key]  # type: ignore[union-attr]
        wake = head.enqueued + self._delay
        if self.config.strategy == "direct":
            enough = len(ready) / len(batcher.slots) >= self.config.minimum_slot_utilization
            if self._delay > 0 and not enough and now < wake:
                return None, wake
            ready.sort(key=lambda s: s.position)
            if not self._fill:
                return [self._take(s) for s in ready], None
            used = {s.position for s in ready}
            return [self._take(s) if s.position in used else None
                    for s in batcher.slots[: ready[-1].position + 1]], None
        chosen = ready[: self._max_rows]
        best = max((p for p in self._preferred if p <= len(chosen)), default=None)
        if best is not None:
            chosen = chosen[:best]
        elif self._delay > 0 and now < wake:
            return None, wake
        return [self._take(s) for s in chosen], None

    @staticmethod
    def _take(slot: _Slot) -> Row:
        sequence = slot.sequence
        assert sequence is not None
        sequence.running = True
        return sequence, sequence.steps.popleft()

    # --- a batch ------------------------------------------------------------------------------------

    def _dispatch(self, batcher: _Batcher, rows: list[Row]) -> None:
        instance = batcher.instance
        template = next(r[1].inputs for r in rows if r is not None)
        requests = []
        for row in rows:
            if row is None:
                requests.append(self._filler(template, instance))
                continue
            sequence, step = row
            if step.flags.start or sequence.state is None:
                sequence.state = self._initial_state(instance)
            requests.append({**step.inputs, **self._control_inputs(step.flags, sequence.id, ready=True),
                             **sequence.state})
        batcher.busy = True
        self._start(instance, rows, requests, partial(self._complete, batcher, rows, instance.rate_limit is not None))

    def _control_inputs(self, flags: SequenceFlags, sequence_id: int | str, *, ready: bool) -> dict[str, np.ndarray]:
        values: dict[str, bool | int | str] = {
            "CONTROL_SEQUENCE_START": flags.start, "CONTROL_SEQUENCE_END": flags.end,
            "CONTROL_SEQUENCE_READY": ready, "CONTROL_SEQUENCE_CORRID": sequence_id,
        }
        return {c.name: _control_value(c, values[kind], self._batched) for kind, c in self._controls.items()}

    def _initial_state(self, instance: Instance) -> dict[str, Any]:
        lead = (1,) if self._batched else ()
        states: dict[str, Any] = {}
        for s in self.config.states:
            zeros = np.zeros(lead + s.start_dims, dtype=s.data_type.numpy)
            states[s.input_name] = _on_device(zeros, instance) if instance.device.is_cuda else zeros
        return states

    def _filler(self, template: Mapping[str, Any], instance: Instance) -> dict[str, Any]:
        """A not-ready row for an empty slot: zero inputs shaped like a real row's, READY false."""
        inputs = {}
        for name, value in template.items():
            dtype = np.dtype(value.dtype)
            blank_row = np.full(value.shape, b"", dtype=object) if dtype.kind == "O" else np.zeros(value.shape, dtype)
            inputs[name] = blank_row
        corrid = self._controls.get("CONTROL_SEQUENCE_CORRID")
        blank = "" if corrid is not None and corrid.data_type.kserve == "BYTES" else 0
        return {**inputs, **self._control_inputs(SequenceFlags(blank), blank, ready=False),
                **self._initial_state(instance)}

    def _complete(self, batcher: _Batcher, rows: list[Row], granted: bool, result: BatchResult | BaseException) -> None:
        """Answer a batch's requests and advance their sequences' states. ``granted``: it ran on the
        rate limiter's grant, which goes back now (the next batch waits for its own grant)."""
        if granted and not self._stopped:
            assert batcher.instance.rate_limit is not None
            batcher.instance.rate_limit.release()
        batcher.busy = False
        self._active.pop(id(rows), None)
        self._wakeup.set()
        now = time.monotonic()
        real = [(i, row) for i, row in enumerate(rows) if row is not None]
        if isinstance(result, BaseException):
            log.warning("model '%s': a batch of %d sequence requests failed on %s: %s", self.name, len(real),
                        batcher.instance.name, result)
        else:
            self.stats.record_batch(len(real), len(real), result.input_ns, result.infer_ns, result.output_ns)
            self._trace_compute(rows, result)
        for index, (sequence, step) in real:
            sequence.running = False
            sequence.last_active = now
            outcome = result if isinstance(result, BaseException) else self._advance(sequence, result.outputs[index])
            if step.flags.end:
                self._release(sequence)
            if step.future.done():
                continue
            if isinstance(outcome, BaseException):
                step.future.set_exception(outcome)
            else:
                step.future.set_result(outcome)

    def _advance(self, sequence: _Sequence, outputs: Outputs) -> Outputs | BaseException:
        """Take the state outputs of one row as the sequence's next state; the rest is the answer
        (an error, and the state left as it was, when the engine returned no state output)."""
        lead = (1,) if self._batched else ()
        for s in self.config.states:
            value = outputs.get(s.output_name)
            shape = None if value is None else tuple(value.shape)
            if shape is None or len(shape) != len(lead + s.dims) or shape[:len(lead)] != lead or \
                    any(d not in (-1, n) for n, d in zip(shape[len(lead):], s.dims, strict=True)):
                want = list(lead + s.dims)
                return OutputMismatchError(
                    f"model '{self.model}': state output '{s.output_name}' of sequence {sequence.id} has shape "
                    f"{'none' if shape is None else list(shape)}, the state needs {want} (-1: any size); the "
                    "sequence keeps its previous state")
        sequence.state = {s.input_name: _keep(outputs.pop(s.output_name)) for s in self.config.states}
        return outputs


def _keep(value: Any) -> Any:
    """A row of a state output as the sequence's next state: a device row (a
    :class:`DeviceTensor` view of the batch's output, which the instance cloned off the engine's
    buffers) stays on the device; host rows are copied so one row does not keep the batch's
    output array alive."""
    return value if isinstance(value, DeviceTensor) else np.array(value, copy=True)


def _on_device(array: np.ndarray, instance: Instance) -> DeviceTensor:
    import torch

    with stream_scope(instance.stream):  # ordered before the batch
        tensor = torch.from_numpy(array).to(instance.device.torch_device)
    return DeviceTensor(tensor, array.dtype, array.shape)
