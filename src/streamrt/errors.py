"""StreamRT's exception tree.

Every error StreamRT raises on purpose derives from :class:`StreamRTError`, carries the
offending value in its message and, where there is one, a hint that says how to fix it.
The CLI prints ``str(error)`` on one line and exits with status 2. ``docs/errors.md`` has one row per
class: its message shape, exit status and what a failure leaves on disk.

Hierarchy::

    StreamRTError
    ├── MissingDependencyError      an optional extra is not installed
    ├── ConfigError                 a bad BuildConfig / RuntimeConfig / PipelineConfig value
    │   └── ProfileError            a shape profile contradicts the model
    ├── ModelError                  the model file itself is unusable
    │   ├── ModelNotFoundError      no such file
    │   ├── InvalidModelError       not ONNX, or fails the ONNX checker
    │   └── UnsupportedOperatorError  a node the backend cannot run (node, op type, opset)
    ├── CalibrationError            int8 calibration data missing or mismatched
    ├── BuildError                  a backend failed to build an engine
    │   └── AccuracyError           the low-precision plan misses --accuracy-threshold
    ├── PlanError                   a plan file cannot be used
    │   ├── PlanFormatError         truncated, tampered, not a plan, unknown format version
    │   ├── PlanMismatchError       built for another backend version, device or library
    │   └── PlanRequirementsError   this machine lacks the plan's backend library or its device
    │                               (also a MissingDependencyError)
    ├── InputError                  bad inference inputs
    │   ├── UnknownInputError       a name the engine does not have
    │   ├── MissingInputError       an input the engine needs was not given
    │   ├── DTypeMismatchError      wrong dtype
    │   ├── ShapeError              shape outside every profile, or wrong rank
    │   └── (video.sources.SourceError  a video/image source cannot be opened or decoded)
    ├── InferenceError              the backend failed while running
    │   └── OutputMismatchError     an output's batch rows, dtype or shape disagree with the model's config
    ├── OutOfMemoryError            host or device memory ran out (build, load or inference)
    ├── PipelineError               the stream/pipeline layer failed
    │   ├── StageError              a stage raised for one item (the item's result carries it)
    │   ├── StageTimeoutError       a stage did not finish in time
    │   └── PipelineClosedError     work submitted after close()
    └── ServeError                  the model server refused or failed one request
        ├── RequestError            malformed request: bad JSON, sizes that disagree, bad parameters
        │   ├── PayloadTooLargeError  body or tensor larger than the server's limits
        │   └── SharedMemoryError   offset/size out of range, region in use or too small, key taken
        │       ├── RegionNotFoundError  no region of that name is registered
        │       └── RegionExistsError    a region of that name is already registered
        ├── UnparsableRequestError  gRPC bytes that do not parse as the request message
        ├── UnknownModelError       no such model or version in the repository
        ├── ModelNotReadyError      the model exists but is loading, unloading or failed to load
        ├── ModelLoadError          a load request (repository API) failed: the message says why
        ├── QueueFullError          the model's queue is at max_queue_size: rejected at once
        ├── RequestTimeoutError     the request's queue timeout expired before it ran
        ├── ServerShuttingDownError the server stopped accepting work (graceful shutdown)
        ├── UnsupportedRequestError a protocol feature StreamRT does not implement
        └── UnauthorizedError       missing or wrong bearer token
"""

from __future__ import annotations

import errno
from typing import Any

__all__ = [
    "AccuracyError",
    "BuildError",
    "CalibrationError",
    "ConfigError",
    "DTypeMismatchError",
    "InferenceError",
    "InputError",
    "InvalidModelError",
    "MissingDependencyError",
    "MissingInputError",
    "ModelError",
    "ModelLoadError",
    "ModelNotFoundError",
    "ModelNotReadyError",
    "OutOfMemoryError",
    "OutputMismatchError",
    "PayloadTooLargeError",
    "PipelineClosedError",
    "PipelineError",
    "PlanError",
    "PlanFormatError",
    "PlanMismatchError",
    "PlanRequirementsError",
    "ProfileError",
    "QueueFullError",
    "RegionExistsError",
    "RegionNotFoundError",
    "RequestError",
    "RequestTimeoutError",
    "ServeError",
    "ServerShuttingDownError",
    "ShapeError",
    "SharedMemoryError",
    "StageError",
    "StageTimeoutError",
    "StreamRTError",
    "UnauthorizedError",
    "UnknownInputError",
    "UnknownModelError",
    "UnparsableRequestError",
    "UnsupportedOperatorError",
    "UnsupportedRequestError",
]


class StreamRTError(Exception):
    """Root of every StreamRT error: a one-line message plus an optional fix."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


# The one wording of each extra's install command, stated here only: the hint of every
# MissingDependencyError, README.md and examples/README.md say it (tests/test_install_wording.py
# checks the docs). torch: the extra on a GPU machine; on a CPU-only machine the pinned version,
# whose wheel here is the CPU build (any other request pulls a multi-GB CUDA build).
TORCH_CPU_INSTALL = "pip install torch==2.13.0"
_INSTALL_HINTS = {
    "torch": f"pip install 'streamrt[torch]'; on a CPU-only machine: {TORCH_CPU_INSTALL}",
}


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` (``pip install 'streamrt[video]'``), as errors and docs say it."""
    return _INSTALL_HINTS.get(extra, f"pip install 'streamrt[{extra}]'")


class MissingDependencyError(StreamRTError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, package: str, extra: str, *, purpose: str = "") -> None:
        what = f" for {purpose}" if purpose else ""
        super().__init__(
            f"the optional package '{package}' is required{what} but is not installed",
            hint=install_hint(extra),
        )
        self.package = package
        self.extra = extra


class ConfigError(StreamRTError, ValueError):
    """A configuration value is invalid."""


class ProfileError(ConfigError):
    """A shape profile contradicts the model (unknown input, wrong rank, min > opt > max...)."""


class ModelError(StreamRTError):
    """The model file cannot be used."""


class ModelNotFoundError(ModelError, FileNotFoundError):
    """The model file does not exist."""


class InvalidModelError(ModelError):
    """The file is not an ONNX model, or the ONNX checker rejects it."""


class UnsupportedOperatorError(ModelError):
    """A node uses an operator the chosen backend cannot run.

    The message names the node, its op type, its domain when it is not the default ONNX domain,
    and, once :func:`streamrt.build` has asked the other backends (``alternatives``), which of
    them could run it.
    """

    def __init__(self, node: str, op_type: str, opset: int, backend: str, *, detail: str = "",
                 domain: str = "", alternatives: tuple[str, ...] | None = None) -> None:
        extra = f": {detail}" if detail else ""
        where = f" from domain '{domain}'" if domain not in ("", "ai.onnx") else ""
        if alternatives is None:
            others, hint = "", "pick another backend with --backend, or re-export the model without this operator"
        elif alternatives:
            others = f"; backends that can run it: {', '.join(alternatives)}"
            hint = f"rebuild with --backend {alternatives[0]}"
        else:
            others = "; no StreamRT backend installed here can run it"
            hint = ("re-export the model without this operator, or register an implementation with the backend "
                    "(an ONNX Runtime custom-op library, a TensorRT plugin)")
        super().__init__(
            f"node '{node}' uses operator {op_type}{where} (opset {opset}) which backend '{backend}' "
            f"cannot run{extra}{others}",
            hint=hint,
        )
        self.node = node
        self.op_type = op_type
        self.opset = opset
        self.backend = backend
        self.detail = detail
        self.domain = domain
        self.alternatives = alternatives

    def with_alternatives(self, alternatives: tuple[str, ...]) -> UnsupportedOperatorError:
        """The same error, naming the backends that could run the operator."""
        return UnsupportedOperatorError(self.node, self.op_type, self.opset, self.backend, detail=self.detail,
                                        domain=self.domain, alternatives=alternatives)


class CalibrationError(StreamRTError):
    """int8 calibration data is missing, empty or does not fit the model."""


class BuildError(StreamRTError):
    """A backend failed to build an engine."""


class AccuracyError(BuildError):
    """A fp16/bf16/int8 plan misses the accuracy threshold against the fp32 reference; no plan is written."""


class PlanError(StreamRTError):
    """A plan file cannot be used."""


class PlanFormatError(PlanError):
    """The file is not a valid plan: truncated, tampered, foreign or of an unknown format version."""


class PlanMismatchError(PlanError):
    """The plan was built for another machine or library version than this one."""

    def __init__(self, field: str, plan_value: Any, local_value: Any, rebuild_command: str) -> None:
        super().__init__(
            f"plan was built for {field}={plan_value!r} but this machine has {field}={local_value!r}",
            hint=f"rebuild it here: {rebuild_command}",
        )
        self.field = field
        self.plan_value = plan_value
        self.local_value = local_value
        self.rebuild_command = rebuild_command


class PlanRequirementsError(PlanError, MissingDependencyError):
    """A plan needs a library or a device this machine lacks (TensorRT, a CUDA GPU).

    The message says what is missing here and what the plan needs (backend and versions, GPU,
    compute capability); the hint says where it runs and how to rebuild for this machine.
    """

    def __init__(self, message: str, *, package: str, extra: str, hint: str) -> None:
        StreamRTError.__init__(self, message, hint=hint)
        self.package = package
        self.extra = extra


class InputError(StreamRTError, ValueError):
    """Inference inputs do not match the engine."""


class UnknownInputError(InputError):
    """An input name the engine does not have."""


class MissingInputError(InputError):
    """An input the engine needs was not given."""


class DTypeMismatchError(InputError):
    """An input has the wrong dtype."""


class ShapeError(InputError):
    """An input shape lies outside every shape profile of the engine."""


class InferenceError(StreamRTError):
    """The backend failed while running an engine."""


class OutputMismatchError(InferenceError):
    """An engine output does not fit what the batch or the config says it must be.

    Raised by the server before a batch's outputs are split among its requests: an output whose
    first dimension is not the batch's total rows (it would hand one request another's data), or
    whose dtype or trailing shape differs from the model config.
    """


class OutOfMemoryError(StreamRTError):
    """Host or device memory ran out while building, loading or running.

    The message names what was being allocated, on which memory, and how much when the library
    said; the hint says what to try. See :func:`streamrt._oom.out_of_memory_guard`.
    """

    def __init__(self, what: str, *, memory: str, requested: str | None, hint: str) -> None:
        amount = f" (tried to allocate {requested})" if requested else ""
        super().__init__(f"out of {memory} memory while {what}{amount}", hint=hint)
        self.what = what
        self.memory = memory
        self.requested = requested


class PipelineError(StreamRTError):
    """The stream or pipeline layer failed."""


class StageError(PipelineError):
    """A pipeline stage raised while processing one item."""

    def __init__(self, stage: str, item: int, cause: BaseException) -> None:
        super().__init__(f"stage '{stage}' failed on item {item}: {type(cause).__name__}: {cause}")
        self.stage = stage
        self.item = item
        self.cause = cause


class StageTimeoutError(PipelineError):
    """A stage did not finish within its timeout."""


class PipelineClosedError(PipelineError):
    """Work was submitted to a pipeline after ``close()``."""


class ServeError(StreamRTError):
    """The model server refused or failed one request (``streamrt.serve.wire.status`` maps it to HTTP/gRPC)."""


class RequestError(ServeError):
    """A malformed request: bad JSON, binary sizes that disagree with the header, bad parameters."""


class PayloadTooLargeError(RequestError):
    """A request body or tensor exceeds the server's size or element-count limits."""


class SharedMemoryError(RequestError):
    """A shared-memory region cannot be used as asked (never written when this is raised)."""


class RegionNotFoundError(SharedMemoryError):
    """A request or status call names a shared-memory region nobody registered (Triton: NOT_FOUND)."""


class RegionExistsError(SharedMemoryError):
    """A register call uses a region name that is already registered (Triton: ALREADY_EXISTS)."""


class UnparsableRequestError(ServeError):
    """gRPC message bytes that do not parse as the RPC's request message (Triton: INTERNAL)."""


class UnknownModelError(ServeError):
    """No model (or no such version of it) in the repository."""


class ModelNotReadyError(ServeError):
    """The model exists but is loading, unloading, or failed to load (the message says why)."""


class ModelLoadError(ServeError):
    """A repository load request failed (``failed to load '<model>', <why>``; Triton: INTERNAL)."""


class QueueFullError(ServeError):
    """The model's queue holds ``max_queue_size`` requests; new ones are rejected at once."""


class RequestTimeoutError(ServeError):
    """A request waited in the queue longer than its timeout and was rejected without running."""


class ServerShuttingDownError(ServeError):
    """The server is shutting down and accepts no new work."""


class UnsupportedRequestError(ServeError):
    """A protocol feature StreamRT does not implement (shared memory, BYTES tensors, ...)."""


class UnauthorizedError(ServeError):
    """The request lacks the bearer token the server was started with."""


# --- OSError, in words (a helper, not an error class: ``__all__`` lists only the classes) ----------

_OS_ERROR_WORDS = {
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOENT: "no such file or directory",
    errno.ENOTDIR: "a part of the path is not a folder",
    errno.EISDIR: "is a directory",
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
}
READ_ONLY_ERRNOS = (errno.EROFS,)
"""errno values of a file system that cannot be written at all (no path on it will do)."""
PERMISSION_ERRNOS = (errno.EACCES, errno.EPERM)
"""errno values of a path this user may not write (another folder will do)."""


def describe_os_error(exc: OSError) -> str:
    """``out/x.plan: read-only file system``: the path and what went wrong, on one line.

    A read-only file system is called that, not "permission denied" (Python's ``strerror`` for
    EROFS is right, but callers that test ``os.access`` see only "not writable").
    """
    what = _OS_ERROR_WORDS.get(exc.errno or 0) or exc.strerror or str(exc)
    if exc.filename is None:
        return what
    target = f" -> {exc.filename2}" if getattr(exc, "filename2", None) else ""
    return f"{exc.filename}{target}: {what}"
