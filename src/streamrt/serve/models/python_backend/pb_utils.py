"""``triton_python_backend_utils`` for StreamRT: the names a Triton Python model imports as ``pb_utils``.

When a ``model.py`` is imported (:mod:`.loader`), this module is registered in ``sys.modules``
as ``triton_python_backend_utils``, so ``import triton_python_backend_utils as pb_utils`` works
unchanged. The names and behaviour follow Triton's python_backend (``src/resources/
triton_python_backend_utils.py`` and the pybind11 classes its stub exports: ``Tensor``,
``InferenceRequest``, ``InferenceResponse``, ``TritonError``, ``TritonModelException``,
``Logger``), as far as a non-decoupled model without BLS uses them.

A :class:`Tensor` holds a NumPy array or, when created with :meth:`Tensor.from_dlpack` from a
device tensor (torch on CUDA), that device tensor: a step can hand GPU tensors on without a host
round trip (:meth:`Tensor.as_numpy` on such a tensor raises, as Triton's does).

``auto_complete_config(auto_complete_model_config)`` is called with a :class:`ModelConfig` at load,
before ``initialize``, as Triton calls it.

Not provided (they raise :class:`TritonModelException` when called): business logic scripting
(``InferenceRequest.exec``), decoupled response senders, request rescheduling, custom metrics.

Example:
    >>> t = Tensor("OUT", np.arange(3, dtype=np.float32))
    >>> t.name(), t.triton_dtype(), t.is_cpu(), t.as_numpy().tolist()
    ('OUT', 11, True, [0.0, 1.0, 2.0])
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "Logger",
    "ModelConfig",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "using_decoupled_model_transaction_policy",
]

log = logging.getLogger("streamrt.serve.models.python_backend.model")

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
"""Config type names -> NumPy types (Triton's table; BYTES tensors are object arrays)."""

# TRITONSERVER_DataType numbers, in Triton's order (0 is INVALID, 14 BF16).
_TRITON_TYPES: tuple[Any, ...] = (None, np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16,
                                  np.int32, np.int64, np.float16, np.float32, np.float64, np.object_)


def triton_to_numpy_type(data_type: int) -> Any:
    """A TRITONSERVER_DataType number -> NumPy type (None for unknown numbers)."""
    return _TRITON_TYPES[data_type] if 0 < data_type < len(_TRITON_TYPES) else None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """A NumPy dtype or type -> TRITONSERVER_DataType number (bytes and object arrays are 13, BYTES)."""
    dtype = np.dtype(data_type)
    if dtype.kind in "OS":
        return 13
    for number, candidate in enumerate(_TRITON_TYPES[1:-1], start=1):
        if dtype == np.dtype(candidate):
            return number
    return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``np.float32`` (KeyError for names outside :data:`TRITON_STRING_TO_NUMPY`)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """A BYTES tensor as Triton's wire form: each element as a 4-byte little-endian length and its bytes
    (C order); ``()`` for an empty tensor, None for a tensor that is not object or bytes."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for item in input_tensor.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts += [struct.pack("<I", len(data)), data]
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of :func:`serialize_byte_tensor`: a 1-D object array of ``bytes``."""
    items, offset = [], 0
    while offset < len(encoded_tensor):
        (length,) = struct.unpack_from("<I", encoded_tensor, offset)
        offset += 4
        items.append(bytes(encoded_tensor[offset: offset + length]))
        offset += length
    return np.array(items, dtype=np.object_)


class TritonModelException(Exception):
    """What a model raises to fail ``initialize``, ``execute`` or ``finalize`` with a message."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg


class TritonError:
    """The error of one response: a message and a Triton error code (``INTERNAL`` by default).

    The code decides the status the client sees, as in Triton: INTERNAL 500, NOT_FOUND 404,
    UNAVAILABLE 503, UNSUPPORTED 501, the others (INVALID_ARG, UNKNOWN, ALREADY_EXISTS,
    CANCELLED) 400.
    """

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, msg: str, code: int = INTERNAL) -> None:
        self._msg = msg
        self._code = code

    def __str__(self) -> str:
        return self._msg

    def message(self) -> str:
        return self._msg

    def code(self) -> int:
        return self._code


def _is_device(value: Any) -> bool:
    return not isinstance(value, np.ndarray) and bool(getattr(value, "is_cuda", False))


class Tensor:
    """A named input or output: a NumPy array, or a device tensor taken in through DLPack.

    Args:
        name: the tensor's name in the model config.
        numpy_array: its data (object arrays of ``bytes`` for BYTES; ``np.str_`` arrays are refused
            as Triton refuses them).
    """

    def __init__(self, name: str, numpy_array: Any, triton_dtype: int | None = None) -> None:
        if isinstance(numpy_array, np.ndarray):
            if numpy_array.dtype.type == np.str_ or numpy_array.dtype.kind == "V":
                raise TritonModelException("Tensor dtype used for numpy_array is not supported by Python backend. "
                                           "Please use np.object_ instead.")
            if triton_dtype is not None and numpy_array.dtype != np.dtype(triton_to_numpy_type(triton_dtype)):
                numpy_array = numpy_array.view(triton_to_numpy_type(triton_dtype))
        elif not _is_device(numpy_array):
            raise TritonModelException(f"Tensor '{name}' needs a numpy array, got {type(numpy_array).__name__}; "
                                       "use Tensor.from_dlpack for framework tensors")
        self._name = name
        self._value: Any = numpy_array

    def __repr__(self) -> str:
        where = "cpu" if self.is_cpu() else "gpu"
        return f"Tensor({self._name!r}, {self._value.dtype}, {tuple(self._value.shape)}, {where})"

    @property
    def value(self) -> Any:
        """The data as held: a NumPy array or a device tensor (StreamRT's accessor, not Triton's)."""
        return self._value

    def name(self) -> str:
        return self._name

    def shape(self) -> list[int]:
        return [int(d) for d in self._value.shape]

    def triton_dtype(self) -> int | None:
        if _is_device(self._value):
            import torch

            host = torch.empty(0, dtype=self._value.dtype).numpy()
            return numpy_to_triton_type(host.dtype)
        return numpy_to_triton_type(self._value.dtype)

    def is_cpu(self) -> bool:
        return not _is_device(self._value)

    def as_numpy(self) -> np.ndarray:
        """The NumPy array (raises for a tensor in GPU memory, as Triton does)."""
        if not self.is_cpu():
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        return self._value

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the data, zero-copy (``torch.utils.dlpack.from_dlpack`` takes it)."""
        if self._value.dtype == np.object_:
            raise TritonModelException(f"Tensor '{self._name}' holds BYTES, which DLPack cannot carry")
        return self._value.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._value.__dlpack__() if stream is None else self._value.__dlpack__(stream=stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._value.__dlpack_device__()

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """A tensor from a DLPack capsule or any object with ``__dlpack__`` (torch, NumPy, CuPy), zero-copy.

        Host data becomes a NumPy array; device data stays a (torch) device tensor. Only C-contiguous
        data is accepted, as in Triton.
        """
        value: Any
        try:
            from torch.utils import dlpack as torch_dlpack
        except ImportError:  # no torch: NumPy takes host tensors that implement __dlpack__
            if not hasattr(dlpack_tensor, "__dlpack__"):
                raise TritonModelException("Tensor.from_dlpack of a capsule needs torch installed") from None
            value = np.from_dlpack(dlpack_tensor)
        else:
            value = torch_dlpack.from_dlpack(dlpack_tensor)
            if not value.is_contiguous():
                raise TritonModelException(f"Tensor '{name}': DLPack tensor is not C-contiguous")
            if not value.is_cuda:
                value = value.numpy()
        if isinstance(value, np.ndarray) and not value.flags.c_contiguous:
            raise TritonModelException(f"Tensor '{name}': DLPack tensor is not C-contiguous")
        return Tensor(name, value)


class InferenceRequest:
    """One request of a batch, as ``execute`` receives it.

    Business logic scripting (building a request to another model and calling :meth:`exec`) is not
    supported: it raises.
    """

    def __init__(self, inputs: Sequence[Tensor], request_id: str = "", correlation_id: Any = 0,
                 requested_output_names: Sequence[str] = (), parameters: dict[str, Any] | None = None,
                 **_: Any) -> None:
        self._inputs = list(inputs)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._requested = list(requested_output_names)
        self._parameters = dict(parameters or {})

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> Any:
        return self._correlation_id

    def requested_output_names(self) -> list[str]:
        """The outputs the client asked for (all of the model's when it named none)."""
        return self._requested

    def parameters(self) -> str:
        """The request's parameters as a JSON string (Triton's convention)."""
        return json.dumps(self._parameters)

    def flags(self) -> int:
        return 0

    def is_cancelled(self) -> bool:
        return False

    def exec(self, *_: Any, **__: Any) -> Any:
        raise TritonModelException("business logic scripting (InferenceRequest.exec) is not supported by StreamRT")

    async_exec = exec
    stream_exec = exec

    def get_response_sender(self) -> Any:
        raise TritonModelException("decoupled models (response senders) are not supported by StreamRT")

    def set_release_flags(self, flags: int) -> None:
        raise TritonModelException("request rescheduling is not supported by StreamRT")


class InferenceResponse:
    """The response to one request: output tensors, or an error (then the tensors are ignored)."""

    def __init__(self, output_tensors: Sequence[Tensor] | None = None, error: TritonError | None = None,
                 parameters: Any = None) -> None:
        if output_tensors is not None and not isinstance(output_tensors, (list, tuple)):
            raise TritonModelException('"output_tensors" must be a list.')
        self._output_tensors = list(output_tensors or ())
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def _log_at(level: int, name: str) -> staticmethod[[str], None]:
    """One of Triton's shorthands ``Logger.log_<level>(message)``: the message at ``level`` (a
    :mod:`logging` level), as :meth:`Logger.log` with that level would log it."""

    def shorthand(message: str) -> None:
        log.log(level, "%s", message)

    shorthand.__name__, shorthand.__qualname__ = name, f"Logger.{name}"
    shorthand.__doc__ = f"Log ``message`` at {logging.getLevelName(level)}."
    return staticmethod(shorthand)


class Logger:
    """Messages from the model into the server log (logger ``streamrt.serve.models.python_backend.model``).

    Triton's API: ``Logger.log(message, Logger.WARNING)`` or its shorthands ``log_info``,
    ``log_warn``, ``log_error`` and ``log_verbose`` (VERBOSE is DEBUG here)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3

    _LEVELS: ClassVar[dict[int, int]] = {INFO: logging.INFO, WARNING: logging.WARNING, ERROR: logging.ERROR,
                                         VERBOSE: logging.DEBUG}

    @staticmethod
    def log(message: str, level: int = INFO) -> None:
        log.log(Logger._LEVELS.get(level, logging.INFO), "%s", message)

    log_info = _log_at(logging.INFO, "log_info")
    log_warn = _log_at(logging.WARNING, "log_warn")
    log_error = _log_at(logging.ERROR, "log_error")
    log_verbose = _log_at(logging.DEBUG, "log_verbose")


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input ``name``, or None."""
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output ``name``, or None."""
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config entry (a dict of the model_config JSON) of input ``name``, or None."""
    return next((t for t in model_config.get("input", ()) if t["name"] == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config entry (a dict of the model_config JSON) of output ``name``, or None."""
    return next((t for t in model_config.get("output", ()) if t["name"] == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Always False here: StreamRT refuses decoupled configs at load."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class ModelConfig:
    """The config ``auto_complete_config`` may complete: ``max_batch_size``, inputs, outputs, dynamic batching.

    Args:
        model_config: the config as Triton's JSON string.
    """

    def __init__(self, model_config: str) -> None:
        self._model_config: dict[str, Any] = json.loads(model_config)
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _where(self) -> str:
        return f"in auto-complete-config function for model '{self._model_config.get('name', '')}'"

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0) or 0)
        if current > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {current}, but {self._where()} "
                             f"specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(f"Configuration specified scheduling_choice as '{scheduler}', but "
                                 f"{self._where()} tries to set scheduling_choice as 'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        self._model_config["model_transaction_policy"] = dict(transaction_policy_dict)

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)

    def _add(self, kind: str, tensor: dict[str, Any]) -> None:
        allowed = {"name", "data_type", "dims", "optional"} if kind == "input" else {"name", "data_type", "dims"}
        extra = set(tensor) - allowed
        if extra:
            raise ValueError(f"{kind} '{tensor.get('name')}' {self._where()} contains properties {sorted(extra)}")
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{kind} '{tensor.get('name', '')}' {self._where()} is missing '{key}' property.")
        for current in self._model_config[kind]:
            if current["name"] != tensor["name"]:
                continue
            if current.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(f"unable to load model '{self._model_config.get('name', '')}', configuration "
                                 f"expects datatype {current['data_type']} for {kind} '{tensor['name']}', "
                                 f"model provides {tensor['data_type']}")
            if current.get("dims") and [int(d) for d in current["dims"]] != [int(d) for d in tensor["dims"]]:
                raise ValueError(f"model '{self._model_config.get('name', '')}', tensor '{tensor['name']}': the "
                                 f"model expects dims {tensor['dims']} but the model configuration specifies dims "
                                 f"{current['dims']}")
            current.update(data_type=tensor["data_type"], dims=list(tensor["dims"]))
            return
        self._model_config[kind].append(dict(tensor))
