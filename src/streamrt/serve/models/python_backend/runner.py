"""Python model instances: a ``TritonPythonModel`` object on a worker thread of its own.

:class:`PythonInstance` plugs into :class:`~streamrt.serve.scheduling.scheduler.ModelScheduler` as an engine
instance does (``name``, ``submit(requests, done)``): the dynamic batcher hands it the requests of
a batch, the worker builds one ``pb_utils.InferenceRequest`` per request (inputs as sent, with
their batch dimension when ``max_batch_size > 0``: nothing is concatenated, as in Triton), calls
``execute`` once for the batch and checks each response on its own (:mod:`.responses`). The
:class:`~streamrt.serve.execution.instances.BatchResult` carries the outputs of the requests that
succeeded and the error of each one that did not, so an error reaches only its request.

Errors in user code never stop the worker:

* ``execute`` raises for a batch of several requests: each request is run again alone, so a
  request that makes the model raise fails by itself and the others succeed (Triton fails the
  whole batch; ``parameters { key: "ISOLATE_FAILED_BATCHES" value: { string_value: "no" } }``
  restores that). The traceback goes to the server log, the message to the client (HTTP 500).
* ``execute`` returns something other than one response per request: every request of the
  batch fails (a bug in the model, not in one request's data).

Each instance's ``initialize`` and ``finalize`` run on its worker too, so thread-local state the
model creates belongs to the thread that uses it. GPU instances (``model_instance_kind`` "GPU") run
``initialize``, ``execute`` and ``finalize`` with a CUDA stream of their own current, so the
kernels of two instances overlap as two Triton stub processes' would.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from streamrt.device.host import HostStream
from streamrt.errors import InferenceError, ModelError, OutputMismatchError, StreamRTError
from streamrt.serve.configs.config import TensorConfig
from streamrt.serve.execution.instances import BatchResult
from streamrt.serve.execution.rate_limiter import Ticket
from streamrt.serve.models.python_backend import loader, pb_utils
from streamrt.serve.models.python_backend.responses import check_response
from streamrt.serve.wire.shared_memory import DeviceTensor
from streamrt.types import DType

__all__ = ["ModelSpec", "PythonInstance", "PythonInstances", "Submitted"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class ModelSpec:
    """What every instance of one model version needs to know.

    Attributes:
        name / version: the model's.
        path: its ``model.py``.
        config_json: the model_config dict ``initialize`` gets (Triton's JSON form).
        outputs: the config's outputs by name.
        batched: ``max_batch_size > 0`` (each request's tensors carry the batch dimension).
        cpu_inputs: give the model host (NumPy) inputs even when they arrive on the device
            (Triton's ``FORCE_CPU_ONLY_INPUT_TENSORS``, "yes" by default).
        isolate: run the requests of a batch whose ``execute`` raised again one by one.
    """

    name: str
    version: int
    path: Path
    model_dir: Path
    config_json: dict[str, Any]
    outputs: Mapping[str, TensorConfig]
    batched: bool
    cpu_inputs: bool = True
    isolate: bool = True


class Submitted(Mapping[str, Any]):
    """One request as the scheduler queues it: its inputs (the mapping) plus what ``execute`` sees of it.

    Attributes:
        request_id: the client's id.
        requested: output names the request wants (all of the model's when it named none).
        parameters: the request's parameters.
        on_device: leave device outputs on the device (a caller that passes them on, e.g. an ensemble).
    """

    __slots__ = ("inputs", "on_device", "parameters", "request_id", "requested")

    def __init__(self, inputs: Mapping[str, Any], request_id: str, requested: tuple[str, ...],
                 parameters: Mapping[str, Any] | None = None, on_device: bool = False) -> None:
        self.inputs = inputs
        self.request_id = request_id
        self.requested = requested
        self.parameters = dict(parameters or {})
        self.on_device = on_device

    def __getitem__(self, key: str) -> Any:
        return self.inputs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.inputs)

    def __len__(self) -> int:
        return len(self.inputs)


class PythonInstance:
    """One ``TritonPythonModel`` object and the worker thread that runs it (create with :meth:`start`)."""

    def __init__(self, name: str, spec: ModelSpec, worker: HostStream) -> None:
        self.name = name
        self.rate_limit: Ticket | None = None  # its place in the server's rate limiter (set at load)
        self.lanes = 1  # one batch at a time: the model's own process runs them
        self.spec = spec
        self._worker = worker
        self._model: Any = None
        self._closed = False
        self._stream: Any = None  # GPU instances: a CUDA stream of their own (see _on_stream)

    def __repr__(self) -> str:
        return f"PythonInstance({self.name!r})"

    @classmethod
    def start(
        cls, spec: ModelSpec, name: str, kind: str, device_id: int, timeout: float | None = None
    ) -> PythonInstance:
        """Import ``model.py``, create the model object and run its ``initialize`` on a new worker.

        Raises:
            ModelError: the import, the constructor or ``initialize`` raised (traceback in the log).
        """
        instance = cls(name, spec, HostStream(f"{name}-python"))
        try:
            instance._call(lambda: instance._initialize(kind, device_id), timeout)
        except BaseException:
            instance._worker.close(timeout=5.0)
            raise
        return instance

    def _initialize(self, kind: str, device_id: int) -> None:
        spec = self.spec
        model_class = loader.import_model_class(spec.path, spec.name, spec.version, self.name)
        args = loader.initialize_args(spec.config_json, model_dir=spec.model_dir, version=spec.version,
                                      instance=self.name, kind=kind, device_id=device_id)
        if kind == "GPU":
            import torch

            self._stream = torch.cuda.Stream()
        try:
            with self._on_stream():
                model = model_class()
                if callable(getattr(model, "initialize", None)):
                    model.initialize(args)
        except Exception as exc:
            loader.forget_module(model_class.__module__)
            log.error("Python model '%s' instance %s: initialize() raised", spec.name, self.name, exc_info=True)
            raise ModelError(f"Python model '{spec.name}' version {spec.version}: initialize() of instance "
                             f"{self.name} raised {type(exc).__name__}: {exc}") from exc
        self._model = model

    def _on_stream(self) -> AbstractContextManager[Any]:
        """GPU instances run the model with their own CUDA stream current: threads share one CUDA
        context, and on the default stream the instances' kernels would run one after another."""
        if self._stream is None:
            return contextlib.nullcontext()
        import torch

        return torch.cuda.stream(self._stream)

    def _call(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run ``fn`` on the worker and wait for its result."""
        future: Future[T] = Future()

        def job() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        self._worker.launch(job)
        return future.result(timeout)

    # --- batches ------------------------------------------------------------------------------

    def submit(
        self, requests: Sequence[Mapping[str, Any]], done: Callable[[BatchResult | BaseException], None]
    ) -> None:
        """Run ``requests`` as one ``execute`` call on the worker; ``done`` gets the result (called once)."""

        def job() -> None:
            try:
                result: BatchResult | BaseException = self.run(requests)
            except BaseException as exc:  # a SystemExit in user code must not leave the batch unanswered
                log.error("Python model instance %s: a batch failed", self.name, exc_info=True)
                result = exc if isinstance(exc, StreamRTError) else InferenceError(
                    f"Failed to process the request(s) for model instance '{self.name}', message: "
                    f"{type(exc).__name__}: {exc}")
            done(result)

        self._worker.launch(job)

    def run(self, requests: Sequence[Mapping[str, Any]]) -> BatchResult:
        """Build the requests, ``execute`` them, check every response (in the calling thread).

        On a GPU instance, everything runs on the instance's stream, which is synchronised before
        the result leaves: outputs kept on the device are complete when another stream reads them.
        """
        with self._on_stream():
            result = self._run(requests)
            if self._stream is not None:
                self._stream.synchronize()
        return result

    def _run(self, requests: Sequence[Mapping[str, Any]]) -> BatchResult:
        t0 = time.perf_counter_ns()
        subs = [r if isinstance(r, Submitted) else Submitted(r, "", tuple(self.spec.outputs)) for r in requests]
        built = [self._request(s) for s in subs]
        rows = [self._rows(s) for s in subs]
        t1 = time.perf_counter_ns()
        outcomes = self._execute(built)
        t2 = time.perf_counter_ns()
        outputs: list[dict[str, Any]] = []
        errors: dict[int, BaseException] = {}
        for index, (sub, outcome) in enumerate(zip(subs, outcomes, strict=True)):
            if not isinstance(outcome, BaseException):
                outcome = check_response(outcome, model=self.spec.name, request_id=sub.request_id,
                                         requested=sub.requested, outputs=self.spec.outputs,
                                         rows=rows[index] if self.spec.batched else None)
                if isinstance(outcome, OutputMismatchError):
                    log.warning("Python model '%s': %s", self.spec.name, outcome)
            if isinstance(outcome, BaseException):
                errors[index] = outcome
                outputs.append({})
                continue
            convert = on_device if sub.on_device else _to_host
            outputs.append({k: convert(v) for k, v in outcome.items()})
        t3 = time.perf_counter_ns()
        return BatchResult(outputs, sum(rows), t1 - t0, t2 - t1, t3 - t2, errors)

    def _rows(self, sub: Submitted) -> int:
        if not self.spec.batched or not sub.inputs:
            return 1
        return int(next(iter(sub.inputs.values())).shape[0])

    def _request(self, sub: Submitted) -> pb_utils.InferenceRequest:
        tensors = []
        for name, value in sub.inputs.items():
            if isinstance(value, DeviceTensor):
                data: Any = np.asarray(value) if self.spec.cpu_inputs else value.tensor
            else:
                data = value
            tensors.append(pb_utils.Tensor(name, data))
        return pb_utils.InferenceRequest(tensors, sub.request_id, 0, sub.requested, sub.parameters)

    def _failure(self, exc: BaseException) -> InferenceError:
        return InferenceError(f"Failed to process the request(s) for model instance '{self.name}', message: "
                              f"{type(exc).__name__}: {exc}")

    def _execute(self, requests: list[pb_utils.InferenceRequest]) -> list[Any]:
        """One outcome per request: what ``execute`` returned for it, or its error."""
        try:
            responses = self._model.execute(requests)
        except Exception as exc:
            if len(requests) > 1 and self.spec.isolate:
                log.info("Python model '%s': execute() raised %s for a batch of %d requests; running them one by one",
                         self.spec.name, type(exc).__name__, len(requests))
                return [self._execute_alone(r) for r in requests]
            log.error("Python model '%s' instance %s: execute() raised", self.spec.name, self.name, exc_info=True)
            return [self._failure(exc)] * len(requests)
        if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
            got = f"{len(responses)} responses" if isinstance(responses, (list, tuple)) else type(responses).__name__
            error = InferenceError(f"model '{self.spec.name}': execute() returned {got} for {len(requests)} requests; "
                                   "it must return a list with one pb_utils.InferenceResponse per request, in order")
            log.error("%s", error)
            return [error] * len(requests)
        return list(responses)

    def _execute_alone(self, request: pb_utils.InferenceRequest) -> Any:
        try:
            responses = self._model.execute([request])
        except Exception as exc:
            log.error("Python model '%s' instance %s: execute() raised for request '%s'", self.spec.name, self.name,
                      request.request_id(), exc_info=True)
            return self._failure(exc)
        if not isinstance(responses, (list, tuple)) or len(responses) != 1:
            return InferenceError(f"model '{self.spec.name}': execute() did not return one response for one request")
        return responses[0]

    # --- end ----------------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Run ``finalize`` on the worker after the work queued before it, then stop the worker."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._finalize, timeout)
        except Exception:
            log.warning("Python model instance %s: finalize did not complete", self.name, exc_info=True)
        finally:
            self._worker.close(timeout=timeout)
            if self.rate_limit is not None:
                self.rate_limit.close()

    def _finalize(self) -> None:
        model, self._model = self._model, None
        try:
            if model is not None and callable(getattr(model, "finalize", None)):
                with self._on_stream():
                    model.finalize()
        except Exception:
            log.error("Python model '%s' instance %s: finalize() raised", self.spec.name, self.name, exc_info=True)
        finally:
            if model is not None:
                loader.forget_module(type(model).__module__)


def _to_host(value: Any) -> Any:
    """A device tensor copied to a NumPy array (in the worker: the event loop never waits on a copy)."""
    if isinstance(value, np.ndarray):
        return value
    return value.detach().cpu().numpy()


def on_device(value: Any) -> Any:
    """A device output as the :class:`DeviceTensor` a later step (or CUDA shared memory) takes."""
    if isinstance(value, np.ndarray):
        return value
    return DeviceTensor(value, DType.from_any(value.dtype).numpy, tuple(int(d) for d in value.shape))


class PythonInstances:
    """Every instance of one Python model version (the scheduler's ``Executors``)."""

    def __init__(self, instances: list[PythonInstance]) -> None:
        self.instances = instances

    def close(self, timeout: float | None = None) -> None:
        for instance in self.instances:
            instance.close(timeout)
