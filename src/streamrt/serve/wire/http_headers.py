"""Remembered JSON headers of HTTP inference requests and replies: parse and write each shape once.

A client sends the same JSON header for every request of one shape (tritonclient and ``streamrt
perf`` write it from the input's name, datatype, shape and byte size; only the tensor bytes after
it change), and a model answers each such request with outputs of one shape, so the replies' JSON
headers repeat too. Parsing and checking that header (``json.loads`` and the walk over its fields)
and writing the reply's (``json.dumps`` of the output descriptions) were ~14 us of a 64 B request's
~90 us in the server's own code (cProfile, ``benchmarks/vs_triton.py``'s null model).

:class:`RequestLayout` is what a header said once it was checked: where each binary tensor lies in
the body. :func:`~streamrt.serve.wire.protocol.decode_http_request` keeps one per header it parsed
that names only binary, non-BYTES inputs and no shared memory (nothing in it depends on anything but
the header's bytes and the body's length), keyed by the header's bytes; a body with a known header
and the length that header implies skips the parse. Anything else takes the full parse, which
raises the same errors as before. Reply headers are kept only for replies whose outputs are all
binary, non-BYTES and not in shared memory (their JSON depends on nothing but the outputs' names,
datatypes and shapes), without the request id, which is appended per reply.

Both tables are bounded (:data:`MAX_ENTRIES`, cleared when full; request headers over
:data:`MAX_HEADER_BYTES` are never kept), so a client that sends a new shape every time costs one
failed lookup per request, never memory.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

__all__ = ["MAX_ENTRIES", "MAX_HEADER_BYTES", "BinaryInput", "BoundedTable", "RequestLayout"]

MAX_ENTRIES = 256
"""Headers each table keeps (a server sees a handful of shapes per model)."""

MAX_HEADER_BYTES = 4096
"""Longer request headers are parsed every time and never kept: the table holds at most
``MAX_ENTRIES * MAX_HEADER_BYTES`` (1 MiB) of header bytes, whatever clients send (a long ``id`` or
parameters would otherwise pin their copies)."""

V = TypeVar("V")


@dataclass(frozen=True)
class BinaryInput:
    """One binary input of a checked header: ``count`` elements of ``dtype`` at ``offset`` in the body."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    count: int
    offset: int

    def view(self, body: memoryview) -> np.ndarray:
        """The input as a zero-copy array over ``body``."""
        return np.frombuffer(body, dtype=self.dtype, count=self.count, offset=self.offset).reshape(self.shape)


@dataclass(frozen=True)
class RequestLayout:
    """What a checked request header says, apart from the tensor bytes.

    Attributes:
        inputs: the binary inputs in body order.
        body_length: the body length the header implies (header + every input's bytes).
        outputs / request_id / binary_output / priority / timeout_us / sequence: as parsed
            (``outputs``: :class:`~.protocol.RequestedOutput` s, ``sequence``: a
            :class:`~.protocol.SequenceFlags` or None; typed loosely because :mod:`.protocol`
            imports this module, not the other way round).
    """

    inputs: tuple[BinaryInput, ...]
    body_length: int
    outputs: tuple[Any, ...]
    request_id: str
    binary_output: bool
    priority: int
    timeout_us: int
    sequence: Any


class BoundedTable(Generic[V]):
    """A dict of at most :data:`MAX_ENTRIES` entries, emptied when a new one would not fit (no
    eviction order to keep: the few shapes in use come back at once)."""

    def __init__(self, limit: int = MAX_ENTRIES) -> None:
        self._entries: dict[Hashable, V] = {}
        self._limit = limit

    def get(self, key: Hashable) -> V | None:
        return self._entries.get(key)

    def put(self, key: Hashable, value: V) -> None:
        if len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[key] = value

    def __len__(self) -> int:
        return len(self._entries)
