"""One served model version, whatever runs it: the scheduler choice, request validation and the answer.

Triton has one model class and one instance class for every backend; so does the server here.
:class:`ScheduledModel` owns everything a request meets between the core and the kind's executors:

* **the scheduler** (:meth:`ScheduledModel.start`): the sequence batcher when the config has
  ``sequence_batching``, else the dynamic batcher (which runs every request alone when the config
  has no ``dynamic_batching``), in front of the executors the kind supplies;
* **validation** (:meth:`ScheduledModel.validate`): names and datatypes, shapes against the config's
  dims and ``max_batch_size``, one batch size across inputs, then the kind's own check (an engine's
  shape profiles); an accepted input signature is remembered, since the checks depend on nothing else;
* **the request's rules**: requested outputs must exist; a sequence id needs ``sequence_batching``;
  a stateful model needs one and takes one row per request (Triton's wording);
* **the answer** (:meth:`ScheduledModel.infer`): the requested outputs (all of them when none is
  named), each as the kind hands it back (an engine's ``reshape`` undone), ranked into Triton's
  classification strings when the request asks for ``class_count``, and on the host unless the
  request asked for device outputs (an ensemble step feeding other steps);
* stop, statistics, metadata and the Triton config message.

A kind supplies how it loads (its ``load`` class method) and what executes:
:meth:`~ScheduledModel._executors` (engine instances, or a Python model's), optionally
:meth:`~ScheduledModel._payload` (what the scheduler queues for one request),
:meth:`~ScheduledModel._check_shapes`, :meth:`~ScheduledModel._from_engine`,
:meth:`~ScheduledModel.release` and :meth:`~ScheduledModel._release_after_scheduler`. An ensemble has
no executors: it replaces :meth:`~ScheduledModel._execute` with its graph of steps.

Example:
    >>> class Echo(ScheduledModel):                      # doctest: +SKIP
    ...     def _executors(self): return my_instances
    >>> model = Echo(1, config, platform="echo"); model.start(); await model.infer(request)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Hashable, Mapping
from typing import Any, ClassVar

import numpy as np

from streamrt.errors import ConfigError, ModelNotReadyError, RequestError, ShapeError
from streamrt.serve.configs.config import ModelConfig
from streamrt.serve.execution.instances import InstanceGroup
from streamrt.serve.models.classification import top_k_classes
from streamrt.serve.models.servable import check_model_shape, checked_inputs, model_metadata
from streamrt.serve.observability.stats import ModelStats
from streamrt.serve.observability.tracing import RequestTrace
from streamrt.serve.scheduling.scheduler import Executors, ModelScheduler
from streamrt.serve.scheduling.sequence import SequenceScheduler
from streamrt.serve.wire.protocol import InferRequest, InferResponse, RequestedOutput
from streamrt.serve.wire.shared_memory import DeviceTensor

__all__ = ["ScheduledModel"]

_ACCEPTED_SIGNATURES = 1024
"""Input signatures a model remembers as valid (forgotten all at once past this many)."""

Signature = tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]


class ScheduledModel:
    """A loaded model version of any kind (the :class:`~streamrt.serve.models.servable.Servable` contract).

    Args:
        version: the version number.
        config: the resolved config (inputs, outputs and ``max_batch_size`` known).
        platform: what metadata reports as the platform.
    """

    kind: ClassVar[str] = "model"
    """How messages name this kind ("model", or "ensemble")."""

    def __init__(self, version: int, config: ModelConfig, platform: str) -> None:
        self.version = version
        self.config = config
        self.platform = platform
        self.stats = ModelStats()
        self.load_seconds = 0.0
        self.labels: dict[str, list[str]] = {}
        self.batched = bool(config.max_batch_size)
        self._inputs = {t.name: t for t in config.input}
        self._outputs = tuple(t.name for t in config.output)
        self._all_outputs = tuple(RequestedOutput(n) for n in self._outputs)
        self._scheduler: ModelScheduler | SequenceScheduler | None = None
        self._started = False
        self._accepted: dict[Signature, tuple[int, Hashable]] = {}
        """Input signatures (name, dtype, shape of each input, in order) validate accepted, with
        their rows and batching key: the checks and the key depend on nothing else, so a signature
        seen before skips them."""

    @property
    def name(self) -> str:
        return self.config.name

    # --- what a kind supplies -----------------------------------------------------------------

    def _executors(self) -> Executors:
        """The instances the scheduler feeds (each kind that runs batches supplies them)."""
        raise NotImplementedError(f"{type(self).__name__} has no executors")

    def _payload(self, request: InferRequest) -> Mapping[str, Any]:
        """What the dynamic batcher queues for one request (default: its inputs as sent)."""
        return request.inputs

    def _check_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """The kind's own check of a request's input shapes, after the config's (default: none)."""

    def _from_engine(self, name: str, value: Any) -> Any:
        """Output ``name`` as the client sees it (default: as the executor returned it)."""
        return value

    def release(self) -> None:
        """Release what the version holds (a load that failed, or a version never started)."""

    def _release_after_scheduler(self) -> None:
        """Release what the scheduler's close (which closes the executors) leaves (default: nothing)."""

    # --- serving ------------------------------------------------------------------------------

    def start(self) -> None:
        """Put the scheduler in front of the executors (call on the event loop once the version is warm)."""
        self._scheduler = self._create_scheduler()
        self._started = True

    def _create_scheduler(self) -> ModelScheduler | SequenceScheduler | None:
        label = f"{self.name}:{self.version}"
        executors = self._executors()
        if self.config.sequence_batching is not None:
            if not isinstance(executors, InstanceGroup):
                raise ConfigError(f"model '{self.name}': sequence_batching needs engine instances")
            return SequenceScheduler(label, executors, self.config, self.stats)
        return ModelScheduler(label, executors, max_batch_size=self.config.max_batch_size or 1,
                              batching=self.config.dynamic_batching, stats=self.stats)

    @property
    def pending(self) -> int:
        """Requests queued and not yet running."""
        return self._scheduler.pending if self._scheduler else 0

    def validate(self, inputs: Mapping[str, Any]) -> int:
        """Check a request's inputs against the model (once: the executor does not check them again);
        return its batch rows.

        Raises:
            UnknownInputError / MissingInputError / DTypeMismatchError / ShapeError: with the model's view.
        """
        return self._admit(inputs)[0]

    def _admit(self, inputs: Mapping[str, Any]) -> tuple[int, Hashable]:
        """:meth:`validate` and :meth:`batching_key` of ``inputs``, remembered by signature."""
        signature = tuple([(name, array.dtype, array.shape) for name, array in inputs.items()])
        admitted = self._accepted.get(signature)
        if admitted is not None:
            return admitted
        admitted = (self._validate(inputs), self.batching_key(inputs))
        if len(self._accepted) >= _ACCEPTED_SIGNATURES:
            self._accepted.clear()
        self._accepted[signature] = admitted
        return admitted

    def _validate(self, inputs: Mapping[str, Any]) -> int:
        shapes: dict[str, tuple[int, ...]] = {}
        for name, tensor, array in checked_inputs(inputs, self._inputs, self.kind, self.name):
            shapes[name] = tuple(array.shape)
            check_model_shape(name, tensor, shapes[name], self.config, kind=self.kind)
        if not self.batched or not shapes:
            self._check_shapes(shapes)
            return 1
        if len({s[0] for s in shapes.values()}) > 1:
            raise ShapeError(f"the inputs of {self.kind} '{self.name}' disagree on the batch size: "
                             + ", ".join(f"{n} {s[0]}" for n, s in shapes.items()))
        self._check_shapes(shapes)
        return next(iter(shapes.values()))[0]

    def batching_key(self, inputs: Mapping[str, Any]) -> Hashable:
        """Requests with equal keys may share a batch: same datatypes and non-batch dims, input by input
        (Triton's rule)."""
        return tuple((n, inputs[n].dtype.str, tuple(inputs[n].shape[1:] if self.batched else inputs[n].shape))
                     for n in self._inputs)

    async def infer(self, request: InferRequest, trace: RequestTrace | None = None) -> InferResponse:
        """Validate, run (queued for the scheduler, or the kind's own way), and answer with the
        requested outputs; ``trace`` gets the queue and compute timestamps."""
        if not self._started:
            raise ModelNotReadyError(f"{self.kind} '{self.name}' version {self.version} is not started")
        for out in request.outputs:
            if out.name not in self._outputs:
                raise RequestError(f"unknown output '{out.name}' for {self.kind} '{self.name}'; "
                                   f"its outputs are: {', '.join(self._outputs)}")
        rows, key = self._admit(request.inputs)
        outputs = await self._execute(request, rows, trace, key)
        answer = self._answer_now(request, outputs)
        if answer is None:  # device tensors to copy to the host first
            answer = await self._answer_copying(request, outputs)
        return InferResponse(self.name, str(self.version), request.id, answer)

    def _execute(self, request: InferRequest, rows: int, trace: RequestTrace | None,
                 key: Hashable) -> Awaitable[Mapping[str, Any]]:
        """The request's outputs from the scheduler, to await (an ensemble runs its steps instead); ``key``:
        its :meth:`batching_key`."""
        scheduler = self._scheduler
        assert scheduler is not None, "a kind without a scheduler replaces _execute"
        if isinstance(scheduler, SequenceScheduler):
            if request.sequence is None:
                raise RequestError(
                    f"inference request to model '{self.name}' must specify a non-zero or non-empty "
                    "correlation ID (it has sequence_batching)",
                    hint="send the request parameter sequence_id (and sequence_start on the first one)")
            if rows != 1:
                raise RequestError(f"inference request to model '{self.name}' must specify batch-size 1 due to "
                                   f"requirements of sequence batcher, got {rows}",
                                   hint="send one row per request; the batcher batches the sequences")
            return scheduler.submit(self._payload(request), flags=request.sequence, key=key, trace=trace)
        if request.sequence is not None:
            raise RequestError(
                f"model '{self.name}' has no sequence_batching, so it keeps no state between requests; "
                f"the request names sequence {request.sequence.id}",
                hint="drop sequence_id/sequence_start/sequence_end, or add sequence_batching to the config")
        return scheduler.submit(
            self._payload(request), rows=rows, key=key,
            priority=request.priority, timeout_us=request.timeout_us, trace=trace,
        )

    def _answer_now(self, request: InferRequest, outputs: Mapping[str, Any]) -> dict[str, Any] | None:
        """The requested outputs as the client gets them: the kind's view, classification strings for
        ``class_count`` (Triton applies the extension to any model's output); None when a device
        tensor must first be copied to the host (:meth:`_answer_copying`). Not a coroutine: the usual
        answer costs no await."""
        answer = {}
        for out in request.outputs or self._all_outputs:
            value = self._from_engine(out.name, outputs[out.name])
            if self._to_host(request, out, value):
                return None
            answer[out.name] = self._classified(out, value)
        return answer

    async def _answer_copying(self, request: InferRequest, outputs: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`_answer_now` with the device tensors copied to the host (off the event loop), unless the
        request keeps them on the device."""
        answer = {}
        for out in request.outputs or self._all_outputs:
            value = self._from_engine(out.name, outputs[out.name])
            if self._to_host(request, out, value):
                value = await asyncio.get_running_loop().run_in_executor(None, np.asarray, value)
            answer[out.name] = self._classified(out, value)
        return answer

    @staticmethod
    def _to_host(request: InferRequest, out: RequestedOutput, value: Any) -> bool:
        return isinstance(value, DeviceTensor) and bool(out.class_count or not request.outputs_on_device)

    def _classified(self, out: RequestedOutput, value: Any) -> Any:
        if not out.class_count:
            return value
        return top_k_classes(value, out.class_count, self.labels.get(out.name, ()), batched=self.batched)

    async def stop(self, timeout: float) -> None:
        """Drain the scheduler (bounded by ``timeout``; it closes the executors), then release the rest.
        Requests that arrive while it drains get the scheduler's "unloading" refusal."""
        if self._scheduler is None:
            self._started = False
            self.release()
            return
        await self._scheduler.close(timeout)
        self._started = False
        self._release_after_scheduler()

    # --- descriptions -------------------------------------------------------------------------

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """The model metadata response (KServe ``$metadata_model_response``)."""
        return model_metadata(self.config, self.platform, versions)

    def _config_platform(self) -> str:
        """The ``platform`` of the Triton config message (Python models: none, as in Triton)."""
        return self.platform

    def triton_config(self) -> Any:
        """The resolved config as Triton's ``inference.ModelConfig`` message."""
        from streamrt.serve.configs.config_message import to_message

        return to_message(self.config, self._config_platform())
