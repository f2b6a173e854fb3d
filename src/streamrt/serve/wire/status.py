"""The one table that maps exceptions to HTTP status, gRPC status code and failure reason.

Both front ends and the metrics use it, so a wrong shape is a 400 / ``INVALID_ARGUMENT`` /
``OTHER`` failure everywhere. Status codes follow Triton (``docs/protocol/README.md``): not found
404, unavailable 503, unsupported 501, internal 500 (a failed model load, gRPC bytes that do not
parse, as Triton), everything else a client got wrong 400 (``ALREADY_EXISTS`` on gRPC for a
region name already registered). The
failure ``reason`` is the label of ``nv_inference_request_failure`` (REJECTED, CANCELED,
BACKEND, OTHER).

Example:
    >>> from streamrt.errors import QueueFullError
    >>> s = status_for(QueueFullError("queue full"))
    >>> s.http, s.grpc, s.reason
    (503, 'UNAVAILABLE', 'REJECTED')
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from streamrt.errors import (
    ConfigError,
    InferenceError,
    InputError,
    ModelLoadError,
    ModelNotReadyError,
    OutOfMemoryError,
    PayloadTooLargeError,
    PipelineError,
    QueueFullError,
    RegionExistsError,
    RegionNotFoundError,
    RequestError,
    RequestTimeoutError,
    ServerShuttingDownError,
    SharedMemoryError,
    StreamRTError,
    UnauthorizedError,
    UnknownModelError,
    UnparsableRequestError,
    UnsupportedRequestError,
)

__all__ = ["STATUS_TABLE", "Status", "status_for"]


@dataclass(frozen=True)
class Status:
    """How one kind of error leaves the server.

    Attributes:
        http: HTTP status code.
        grpc: name of the ``grpc.StatusCode`` member.
        reason: failure reason label for metrics (REJECTED, CANCELED, BACKEND, OTHER).
    """

    http: int
    grpc: str
    reason: str


# Most specific first: the first class the error is an instance of wins.
STATUS_TABLE: tuple[tuple[type[BaseException], Status], ...] = (
    (UnauthorizedError, Status(401, "UNAUTHENTICATED", "OTHER")),
    (PayloadTooLargeError, Status(413, "RESOURCE_EXHAUSTED", "OTHER")),
    (RegionNotFoundError, Status(404, "NOT_FOUND", "OTHER")),  # Triton's codes for these two
    (RegionExistsError, Status(400, "ALREADY_EXISTS", "OTHER")),
    (SharedMemoryError, Status(400, "INVALID_ARGUMENT", "OTHER")),  # bad range or size; region in use; key taken
    (RequestError, Status(400, "INVALID_ARGUMENT", "OTHER")),
    (InputError, Status(400, "INVALID_ARGUMENT", "OTHER")),
    (UnknownModelError, Status(404, "NOT_FOUND", "OTHER")),
    (ModelNotReadyError, Status(503, "UNAVAILABLE", "OTHER")),
    (ModelLoadError, Status(500, "INTERNAL", "OTHER")),  # Triton: "failed to load '<m>', ..." is INTERNAL
    (UnparsableRequestError, Status(500, "INTERNAL", "OTHER")),  # as gRPC's C++ server: "Unable to parse request"
    (QueueFullError, Status(503, "UNAVAILABLE", "REJECTED")),
    (RequestTimeoutError, Status(503, "UNAVAILABLE", "REJECTED")),
    (ServerShuttingDownError, Status(503, "UNAVAILABLE", "REJECTED")),
    (UnsupportedRequestError, Status(501, "UNIMPLEMENTED", "OTHER")),
    (asyncio.CancelledError, Status(499, "CANCELLED", "CANCELED")),
    (ConfigError, Status(400, "INVALID_ARGUMENT", "OTHER")),
    (OutOfMemoryError, Status(503, "RESOURCE_EXHAUSTED", "BACKEND")),
    (InferenceError, Status(500, "INTERNAL", "BACKEND")),
    (PipelineError, Status(500, "INTERNAL", "BACKEND")),
    (StreamRTError, Status(500, "INTERNAL", "OTHER")),
)

_INTERNAL = Status(500, "INTERNAL", "BACKEND")


def status_for(error: BaseException) -> Status:
    """The :class:`Status` of ``error``; anything unexpected is an internal (500) backend failure."""
    for cls, status in STATUS_TABLE:
        if isinstance(error, cls):
            return status
    return _INTERNAL
