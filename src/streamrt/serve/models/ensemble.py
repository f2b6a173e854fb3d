"""Ensembles: one request in, one response out, through a DAG of other models' steps (Triton's
``ensemble_scheduling``).

A config with ``platform: "ensemble"`` declares the ensemble's own inputs and outputs (names,
data types, dims, ``max_batch_size``) and its steps (:mod:`.ensemble_config`). Loading
(:func:`load_ensemble`) runs after the repository has loaded the step models
(:meth:`ModelRepository._load_steps`): it checks every step against its model's resolved config
(mapped names exist, every model input is fed, data types and dims agree where both sides know
them, the ensemble's batch fits the model's ``max_batch_size``) and refuses the ensemble with a
:class:`~streamrt.errors.ConfigError` otherwise.

Execution (:meth:`EnsembleModel.infer`): the request's inputs are checked against the ensemble's
config, then every step whose tensors exist starts at once as an asyncio task calling its model's
``infer`` (found through the repository's lookup at request time, so a reloaded step model is
picked up); independent steps of one request therefore queue and run concurrently, each on its
model's own instances and streams, and every step model keeps its own dynamic batcher. Step
requests inherit the request's id, priority and timeout. An error in a step fails this request
only, with its type kept (a shape error stays a 400) and a message naming the step and its model;
the other running steps of the request are cancelled.

Device tensors between steps: a step whose outputs feed only other steps (none of them is an
ensemble output) asks its model for device outputs (``InferRequest.outputs_on_device``): a CUDA
engine instance then hands back :class:`~streamrt.serve.wire.shared_memory.DeviceTensor` views instead
of copying to pinned host memory, and the next step's CUDA instance gathers them on the device
(:mod:`.instances`), so the tensors never round-trip through the host. CPU instances ignore the
flag and return host arrays; steps that produce ensemble outputs always return host arrays.

Statistics follow Triton's: the ensemble's ``queue`` and ``compute_*`` are the sums of its step
requests' times, each ensemble request counts one execution; the composing models count the step
requests in their own statistics; per-step counts and durations go to
:meth:`ModelStats.record_step` (``/metrics``: ``streamrt_ensemble_step_*`` with a ``step`` label).

Example:
    >>> served = load_ensemble(LoadContext(Path("repo/chain"), 1, config, lookup=repo.get))  # doctest: +SKIP
    >>> served.start(); await served.infer(InferRequest("chain", inputs={"IN": x}))          # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from streamrt.errors import ConfigError, InferenceError, ModelNotReadyError, StreamRTError
from streamrt.serve.configs.config import ModelConfig, TensorConfig
from streamrt.serve.configs.ensemble_config import EnsembleConfig, EnsembleStep
from streamrt.serve.models.classification import read_labels
from streamrt.serve.models.scheduled import ScheduledModel
from streamrt.serve.models.servable import LoadContext, Servable
from streamrt.serve.observability.tracing import RequestTrace
from streamrt.serve.wire.protocol import InferRequest, RequestedOutput
from streamrt.serve.wire.status import status_for
from streamrt.types import DType

__all__ = ["EnsembleModel", "load_ensemble"]

log = logging.getLogger(__name__)

Lookup = Callable[[str, str], Servable]


def _full_shape(tensor: TensorConfig, max_batch_size: int) -> tuple[int, ...]:
    return (-1, *tensor.dims) if max_batch_size else tuple(tensor.dims)


def _agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


@dataclass(frozen=True)
class _Spec:
    """What is known about one ensemble tensor: its type, its shape with the batch dim, and from where."""

    dtype: DType
    shape: tuple[int, ...]
    source: str


def _check_steps(config: ModelConfig, ensemble: EnsembleConfig, order: tuple[int, ...], lookup: Lookup) -> None:
    """Check each step against its model's resolved config (see the module docstring)."""
    where = f"ensemble '{config.name}'"
    mbs = config.max_batch_size or 0
    known = {t.name: _Spec(t.data_type, _full_shape(t, mbs), f"ensemble input '{t.name}'") for t in config.input}
    wanted = {t.name: _Spec(t.data_type, _full_shape(t, mbs), f"ensemble output '{t.name}'") for t in config.output}

    def compare(tensor: str, spec: _Spec, other: _Spec | None) -> None:
        if other is None:
            return
        if spec.dtype is not other.dtype:
            raise ConfigError(f"{where}: tensor '{tensor}' is TYPE_{other.dtype.kserve} as {other.source} but "
                              f"TYPE_{spec.dtype.kserve} as {spec.source}")
        if not _agree(spec.shape, other.shape):
            raise ConfigError(f"{where}: tensor '{tensor}' has shape {list(other.shape)} as {other.source} but "
                              f"{list(spec.shape)} as {spec.source} (batch dimension included, -1: any size)")

    for index in order:
        step = ensemble.steps[index]
        what = f"{where} {step.describe(index)}"
        try:
            model = lookup(step.model_name, step.version)
        except StreamRTError as exc:
            raise ConfigError(f"{what}: {exc.message}", hint="load the step model first, or fix model_version") \
                from None
        step_config = model.config
        step_mbs = step_config.max_batch_size or 0
        if mbs and step_mbs < mbs:
            raise ConfigError(f"{what}: the ensemble's max_batch_size {mbs} exceeds the model's {step_mbs}",
                              hint=f"set the ensemble's max_batch_size <= {step_mbs}")
        for kind, tensors, mapping in (("input", step_config.input, step.input_map),
                                       ("output", step_config.output, step.output_map)):
            if not tensors:
                continue  # a model that declares none: nothing is known to check against
            by_name = {t.name: t for t in tensors}
            for key, tensor in mapping.items():
                if key not in by_name:
                    raise ConfigError(f"{what}: {kind}_map names '{key}', which is not an {kind} of the model; "
                                      f"its {kind}s are: {', '.join(by_name)}")
                spec = _Spec(by_name[key].data_type, _full_shape(by_name[key], step_mbs),
                             f"{kind} '{key}' of {step.describe(index)}")
                if kind == "input":
                    compare(tensor, spec, known.get(tensor))
                else:
                    compare(tensor, spec, wanted.get(tensor))
                    known[tensor] = spec
            missing = [t for t in by_name if t not in mapping]
            if kind == "input" and missing:
                raise ConfigError(f"{what}: model input '{missing[0]}' is not in the step's input_map",
                                  hint=f"map it: input_map {{ key: \"{missing[0]}\" value: \"<ensemble tensor>\" }}")


def load_ensemble(context: LoadContext) -> Servable:
    """The ensemble kind's loader (:data:`streamrt.serve.models.servable.KINDS`): check the graph and the
    steps against their (already loaded) models.

    Raises:
        ConfigError: no ``ensemble_scheduling``, a bad graph, or a step its model contradicts.
    """
    started = time.perf_counter()
    config = context.config
    ensemble = config.ensemble_scheduling
    if ensemble is None:
        raise ConfigError(f"model '{config.name}': platform \"ensemble\" needs ensemble_scheduling {{ step [...] }}")
    if context.lookup is None:
        raise ConfigError(f"ensemble '{config.name}': loading an ensemble needs the repository's model lookup")
    if not config.input or not config.output:
        raise ConfigError(f"ensemble '{config.name}': an ensemble declares its inputs and outputs")
    resolved = config.replace(max_batch_size=config.max_batch_size or 0, instance_group=(), backend="")
    order = ensemble.order(config.name, [t.name for t in config.input], [t.name for t in config.output])
    _check_steps(resolved, ensemble, order, context.lookup)
    model = EnsembleModel(context.version, resolved, ensemble, context.lookup)
    model.labels = read_labels(context.model_dir, resolved)
    model.load_seconds = time.perf_counter() - started
    return model


@dataclass
class _StepTimes:
    """The queue and compute times of one request's steps, added up (Triton's ensemble statistics)."""

    queue: int = 0
    input: int = 0
    infer: int = 0
    output: int = 0

    def add(self, trace: RequestTrace) -> None:
        marks = dict(trace.timestamps)
        if "COMPUTE_END" not in marks:
            return  # a model that does not report its phases (e.g. a nested ensemble)
        self.queue += marks.get("COMPUTE_START", 0) - marks.get("QUEUE_START", marks.get("COMPUTE_START", 0))
        self.input += marks.get("COMPUTE_INPUT_END", 0) - marks.get("COMPUTE_START", 0)
        self.infer += marks.get("COMPUTE_OUTPUT_START", 0) - marks.get("COMPUTE_INPUT_END", 0)
        self.output += marks["COMPUTE_END"] - marks.get("COMPUTE_OUTPUT_START", 0)


class EnsembleModel(ScheduledModel):
    """A loaded ensemble version (the :class:`~streamrt.serve.models.servable.Servable` contract).

    Validation, output selection (classification included) and the Triton config are
    :class:`~streamrt.serve.models.scheduled.ScheduledModel`'s; what executes is the graph of steps
    (:meth:`_execute`), which has no queue of its own: each step model keeps its own scheduler.
    """

    kind = "ensemble"

    def __init__(self, version: int, config: ModelConfig, ensemble: EnsembleConfig, lookup: Lookup) -> None:
        super().__init__(version, config, "ensemble")
        self._steps = ensemble.steps
        self._lookup = lookup
        ensemble_outputs = set(self._outputs)
        self._on_device = [not set(s.output_map.values()) & ensemble_outputs for s in self._steps]
        self._needs = [frozenset(s.input_map.values()) for s in self._steps]
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def _create_scheduler(self) -> None:
        """None: an ensemble has no queue of its own (its step models report theirs in ``pending``)."""
        return None

    async def stop(self, timeout: float) -> None:
        """Refuse new requests and wait (up to ``timeout``) for the in-flight ones; the step models
        belong to the repository."""
        self._started = False
        if self._inflight:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except asyncio.TimeoutError:
                log.warning("ensemble '%s': %d requests still running after %.1f s", self.name, self._inflight,
                            timeout)

    # --- serving ------------------------------------------------------------------------------

    async def _execute(self, request: InferRequest, rows: int, trace: RequestTrace | None,
                       key: Hashable) -> dict[str, Any]:
        """Run the steps as their inputs become available; count the request as one execution whose
        queue and compute times are its steps' sums (Triton's ensemble statistics)."""
        self._inflight += 1
        self._idle.clear()
        times = _StepTimes()
        try:
            tensors = await self._run(request, times, trace)
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
        self.stats.record_queue(times.queue)
        self.stats.record_batch(rows, 1, times.input, times.infer, times.output)
        return tensors

    async def _run(self, request: InferRequest, times: _StepTimes, trace: RequestTrace | None) -> dict[str, Any]:
        """The DAG scheduler: start every step whose tensors exist, collect outputs, repeat."""
        tensors: dict[str, Any] = dict(request.inputs)
        waiting = list(range(len(self._steps)))
        running: dict[asyncio.Task[dict[str, Any]], int] = {}
        try:
            while waiting or running:
                for index in [i for i in waiting if self._needs[i].issubset(tensors)]:
                    waiting.remove(index)
                    task = asyncio.create_task(self._step(index, request, tensors, times, trace))
                    running[task] = index
                if not running:  # the load-time graph check makes this unreachable
                    raise InferenceError(f"ensemble '{self.name}': steps {waiting} can never run")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=running.__getitem__):
                    running.pop(task)
                    tensors.update(task.result())
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        return tensors

    async def _step(
        self, index: int, request: InferRequest, tensors: Mapping[str, Any], times: _StepTimes,
        trace: RequestTrace | None,
    ) -> dict[str, Any]:
        """One step request: its model's outputs under the ensemble tensor names they map to."""
        step = self._steps[index]
        started = time.perf_counter_ns()
        try:
            model = self._lookup(step.model_name, step.version)
        except StreamRTError as exc:
            self.stats.record_step(index, step.model_name, time.perf_counter_ns() - started, ok=False)
            raise ModelNotReadyError(f"ensemble '{self.name}' {step.describe(index)}: {exc.message}",
                                     hint=exc.hint) from None
        sub = InferRequest(
            step.model_name, step.version, request.id,
            inputs={key: tensors[tensor] for key, tensor in step.input_map.items()},
            outputs=tuple(RequestedOutput(key) for key in step.output_map),
            priority=request.priority, timeout_us=request.timeout_us, received_ns=started,
            outputs_on_device=self._on_device[index],
            # Triton hands the correlation id to every step; here only stateful steps take it
            sequence=request.sequence if model.config.sequence_batching is not None else None,
        )
        step_trace = RequestTrace(0, model.name, str(model.version), request.id)
        try:
            response = await model.infer(sub, step_trace)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            elapsed = time.perf_counter_ns() - started
            model.stats.record_failure(status_for(exc).reason, elapsed)
            self.stats.record_step(index, step.model_name, elapsed, ok=False)
            raise self._step_error(index, step, exc) from exc
        elapsed = time.perf_counter_ns() - started
        model.stats.record_success(elapsed)
        self.stats.record_step(index, step.model_name, elapsed, ok=True)
        times.add(step_trace)
        if trace is not None:
            for name, ns in step_trace.timestamps:
                trace.mark(f"STEP{index}_{name}", ns)
        missing = [key for key in step.output_map if key not in response.outputs]
        if missing:
            raise InferenceError(f"ensemble '{self.name}' {step.describe(index)}: the model returned no "
                                 f"output '{missing[0]}'")
        return {step.output_map[key]: value for key, value in response.outputs.items() if key in step.output_map}

    def _step_error(self, index: int, step: EnsembleStep, exc: BaseException) -> BaseException:
        """``exc`` with the step and its model named, its type kept so that its status is too."""
        prefix = f"ensemble '{self.name}' {step.describe(index)}: "
        if isinstance(exc, StreamRTError):
            try:
                return type(exc)(prefix + exc.message, hint=exc.hint)
            except TypeError:  # an error class with another constructor
                return InferenceError(prefix + str(exc))
        return InferenceError(f"{prefix}{type(exc).__name__}: {exc}")

