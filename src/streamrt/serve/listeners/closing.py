"""Closing what a server opened: every closer runs, newest first, whatever the others do.

The one-process server, the front-end supervisor and each front-end worker keep a list of
``async`` closers (a runner's ``cleanup``, a gRPC server's ``stop``) as they bind their
listeners; :func:`close_each` runs them in reverse, so a listener that fails to close is one
warning and never keeps the others open (ports would stay bound until the process ends).

Example:
    >>> import asyncio
    >>> closed = []
    >>> async def close(): closed.append(1)
    >>> asyncio.run(close_each([close, close], "a listener"))
    >>> closed
    [1, 1]
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["close_each"]

log = logging.getLogger(__name__)


async def close_each(closers: list[Callable[[], Awaitable[Any]]], what: str) -> None:
    """Await each closer, newest first, logging (not raising) a failure as "closing ``what`` failed";
    ``closers`` is empty afterwards."""
    for close in reversed(closers):
        try:
            await close()
        except Exception:
            log.warning("closing %s failed", what, exc_info=True)
    closers.clear()
