"""The inference port: what an HTTP or gRPC listener needs from whatever runs its requests.

A listener (:mod:`streamrt.serve.listeners.http`, :mod:`streamrt.serve.listeners.grpc_service`) parses a request,
hands it to an :class:`InferencePort`, and encodes the answer; it never sees the server core.
Two ports exist:

* :class:`~streamrt.serve.core.ServerCore` (one process): runs the request through its model's
  scheduler;
* :class:`~streamrt.serve.listeners.frontends.worker.EngineLink` (a ``--frontend-processes N`` worker):
  sends the request's tensors to the engine process through its arena and channel.

So a front-end worker is the same listeners over its engine link, plus a forwarder for the routes
that are not inference (health, metadata, repository, shared-memory registration), and every
front-end feature of the inference path (auth, tracing, shared memory, sequence flags,
compression) is written once, in the listeners, for both.

Two helpers every process that binds listeners shares (the one-process server, the front-end
supervisor, each front-end worker): :func:`port_in_use` (the one-line error of a busy port) and
:func:`close_each` (close what was bound, newest first, whatever fails).

Example:
    >>> port: InferencePort = core                                            # doctest: +SKIP
    >>> port.check_auth(request.headers.get("Authorization"))                 # doctest: +SKIP
    >>> payload = await port.answer(infer_request, encode)                    # doctest: +SKIP
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from streamrt.errors import ConfigError, UnauthorizedError

if TYPE_CHECKING:
    from streamrt.serve.configs.config import ServerConfig
    from streamrt.serve.wire.protocol import InferRequest, InferResponse
    from streamrt.serve.wire.shared_memory import RegionSource

__all__ = ["InferencePort", "RequestBuffer", "check_bearer", "close_each", "port_in_use"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def check_bearer(token: str | None, header: str | None) -> None:
    """Raise :class:`UnauthorizedError` unless ``header`` is ``Bearer <token>`` (when a token is set).

    The one place the token is compared (in constant time), for every listener of every process.
    """
    if token is None:
        return
    given = (header or "").removeprefix("Bearer ").strip() if (header or "").startswith("Bearer ") else ""
    if not given or not hmac.compare_digest(given.encode(), token.encode()):
        raise UnauthorizedError("missing or wrong bearer token", hint="send 'Authorization: Bearer <token>'")


@dataclass(eq=False)
class RequestBuffer:
    """Memory for one request body, handed out by the port that will run the request.

    The listener reads the body into ``array`` (its tensors are then views of it) and passes the
    buffer to :meth:`InferencePort.answer`, which owns it from then on; a request that fails before
    (malformed, refused) gives it back with :meth:`release`.

    Attributes:
        array: ``nbytes`` of uninitialised uint8 memory.
        block: the port's own handle on the memory (a front-end worker's arena offset); None for
            plain process memory.
        free: how the port takes ``block`` back (called once, by :meth:`release`).
    """

    array: np.ndarray
    block: int | None = None
    free: Callable[[int], None] | None = None

    def release(self) -> None:
        """Give the memory back to its port (a no-op for plain memory, and after the first call)."""
        block, self.block = self.block, None
        if block is not None and self.free is not None:
            self.free(block)


@runtime_checkable
class InferencePort(Protocol):
    """What the HTTP and gRPC listeners need from the server on the inference path."""

    @property
    def config(self) -> ServerConfig:
        """Limits (``max_request_bytes``, ``max_tensor_elements``) and the auth token."""
        ...

    @property
    def regions(self) -> RegionSource:
        """Where a request's shared-memory inputs and outputs are looked up while it is parsed."""
        ...

    def check_auth(self, header: str | None) -> None:
        """Raise :class:`UnauthorizedError` unless the ``Authorization`` header carries the token."""
        ...

    def request_buffer(self, nbytes: int) -> RequestBuffer:
        """Memory to read a request body of ``nbytes`` into (in a worker: its shared arena)."""
        ...

    async def answer(self, request: InferRequest, encode: Callable[[InferResponse], T],
                     buffer: RequestBuffer | None = None) -> T:
        """Run ``request`` and return ``encode(response)``.

        ``encode`` runs while the response's tensors are valid (in a worker they are views of the
        arena, given back once it returns). ``buffer`` (the body's memory, if the port handed one
        out) belongs to the port from this call on: it is given back once nothing reads the request.
        """
        ...


def port_in_use(listener: str, host: str, port: int, flag: str) -> ConfigError:
    """One line naming the port a listener cannot bind and the flag that moves it (0: any free port)."""
    return ConfigError(f"cannot listen for {listener} on {host}:{port}: the port is already in use "
                       "(another server running?)", hint=f"{flag} N with a free port, or {flag} 0 to pick any")


async def close_each(closers: list[Callable[[], Awaitable[Any]]], what: str) -> None:
    """Await each closer (a runner's ``cleanup``, a gRPC server's ``stop``), newest first, logging a
    failure as "closing ``what`` failed" instead of raising, so one listener that fails to close
    never keeps the others bound; ``closers`` is empty afterwards. The one-process server, the
    front-end supervisor and each front-end worker close what they bound with it."""
    for close in reversed(closers):
        try:
            await close()
        except Exception:
            log.warning("closing %s failed", what, exc_info=True)
    closers.clear()
