"""What ``execute`` returned, checked request by request against the config.

Each response becomes either the request's outputs or the request's own error; nothing a model
returns can fail another request of the batch or reach the client unchecked:

* a response with ``error=TritonError(msg, code)`` fails its request with ``msg`` and the status
  Triton gives that code (:data:`STATUS_OF_CODE`: INTERNAL 500, INVALID_ARG 400, ...);
* a missing requested output, a dtype other than the config's, dims that do not fit the config's
  or a first dimension other than the request's rows (batching models) fail the request with
  :class:`~streamrt.errors.OutputMismatchError` (500), naming model, request, output and values;
* ``None`` or anything that is not an ``InferenceResponse`` fails its request (500).

Example:
    >>> from streamrt.serve.models.python_backend import pb_utils
    >>> type(error_of(pb_utils.TritonError("bad", pb_utils.TritonError.INVALID_ARG))).__name__
    'RequestError'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from streamrt.errors import (
    ConfigError,
    InferenceError,
    ModelNotReadyError,
    OutputMismatchError,
    RequestError,
    StreamRTError,
    UnknownModelError,
    UnsupportedRequestError,
)
from streamrt.serve.configs.config import TensorConfig
from streamrt.serve.models.python_backend.pb_utils import InferenceResponse, TritonError
from streamrt.types import DType

__all__ = ["STATUS_OF_CODE", "check_response", "error_of"]

STATUS_OF_CODE: dict[int, type[StreamRTError]] = {
    TritonError.UNKNOWN: RequestError,
    TritonError.INTERNAL: InferenceError,
    TritonError.NOT_FOUND: UnknownModelError,
    TritonError.INVALID_ARG: RequestError,
    TritonError.UNAVAILABLE: ModelNotReadyError,
    TritonError.UNSUPPORTED: UnsupportedRequestError,
    TritonError.ALREADY_EXISTS: RequestError,
    TritonError.CANCELLED: RequestError,
}
"""A TritonError code -> the StreamRT error whose status (:mod:`streamrt.serve.wire.status`) is Triton's for it."""


def error_of(error: TritonError) -> StreamRTError:
    """The request error for a response's ``TritonError`` (its message as the model wrote it)."""
    code = error.code() if callable(getattr(error, "code", None)) else TritonError.INTERNAL
    return STATUS_OF_CODE.get(code, InferenceError)(str(error.message()))


def _which(model: str, request_id: str) -> str:
    return f"model '{model}', request '{request_id}'" if request_id else f"model '{model}'"


_DTYPES: dict[Any, DType | None] = {}
"""The DType of each array dtype seen (``DType.from_any`` per output of every response cost ~1 us)."""


def _dtype_of(value: Any) -> DType | None:
    dtype = value.dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        pass
    except TypeError:  # an unhashable dtype-like: look it up every time
        return _lookup_dtype(dtype)
    found = _DTYPES[dtype] = _lookup_dtype(dtype)
    return found


def _lookup_dtype(dtype: Any) -> DType | None:
    try:
        return DType.from_any(dtype)
    except (ConfigError, TypeError):
        return None


def check_response(
    response: Any, *, model: str, request_id: str, requested: Sequence[str], outputs: Mapping[str, TensorConfig],
    rows: int | None,
) -> dict[str, Any] | StreamRTError:
    """The requested outputs of one response, checked; or the error its request fails with.

    Args:
        response: what ``execute`` put at this request's place.
        model: for messages.
        request_id: the client's id (for messages; may be empty).
        requested: the output names the request wants.
        outputs: the config's outputs by name.
        rows: the request's batch rows (the first dim every output must have); None: no batch dim.
    """
    # The messages are written only when a check fails: this runs for every response of every batch.
    if not isinstance(response, InferenceResponse):
        return InferenceError(f"{_which(model, request_id)}: execute() returned {type(response).__name__} for the "
                              "request, not a pb_utils.InferenceResponse")
    error = response.error()
    if error is not None:
        return error_of(error)
    given = {t.name(): t for t in response.output_tensors()}
    result: dict[str, Any] = {}
    for name in requested:
        tensor = given.get(name)
        if tensor is None:
            return OutputMismatchError(f"{_which(model, request_id)}: the response has no output '{name}' "
                                       f"(it has {', '.join(given) or 'none'})")
        value = tensor.value
        config = outputs[name]
        got = _dtype_of(value)
        if got is not config.data_type:
            shown = got.kserve if got is not None else str(value.dtype)
            wanted = "STRING" if config.data_type is DType.BYTES else config.data_type.kserve
            return OutputMismatchError(f"{_which(model, request_id)}: output '{name}' has datatype {shown}, "
                                       f"the config says TYPE_{wanted}")
        shape = value.shape if isinstance(value, np.ndarray) else tuple(int(d) for d in value.shape)
        dims = shape[1:] if rows is not None else shape
        fits = len(dims) == len(config.dims) and all(c in (-1, d) for d, c in zip(dims, config.dims, strict=True))
        if not fits or (rows is not None and (not shape or shape[0] != rows)):
            expected = ([rows] if rows is not None else []) + list(config.dims)
            return OutputMismatchError(f"{_which(model, request_id)}: output '{name}' has shape {list(shape)}, "
                                       f"the config expects {expected} (-1: any size)")
        if isinstance(value, np.ndarray) and value.dtype.kind == "S":
            value = value.astype(np.object_)
        result[name] = value
    return result
