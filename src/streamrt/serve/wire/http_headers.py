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

A request's ``id`` is not part of the key: a client that numbers its requests (tritonclient's
``request_id``, ``streamrt perf --profile-export-file``) sends a new id each time, and with it in the
key every request took the full parse. tritonclient and ``streamrt perf`` write it as the header's
first member (``{"id": "...", ...``); :func:`without_request_id` takes it out of the key there and
gives it back to the request, and the tensors' offsets move by the difference in header length. An
id written elsewhere, or with JSON escapes, stays in the key, as before.

Both tables are bounded (:data:`MAX_ENTRIES`, cleared when full; request headers over
:data:`MAX_HEADER_BYTES` are never kept), so a client that sends a new shape every time costs one
failed lookup per request, never memory.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

__all__ = ["MAX_ENTRIES", "MAX_HEADER_BYTES", "BinaryInput", "BoundedTable", "RequestLayout", "without_request_id"]

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

    def view(self, body: memoryview, shift: int = 0) -> np.ndarray:
        """The input as a zero-copy array over ``body`` (whose header is ``shift`` bytes longer than the
        remembered one's)."""
        return np.frombuffer(body, dtype=self.dtype, count=self.count, offset=self.offset + shift).reshape(self.shape)


@dataclass(frozen=True)
class RequestLayout:
    """What a checked request header says, apart from the tensor bytes.

    Attributes:
        inputs: the binary inputs in body order.
        body_length: the body length the header implies (header + every input's bytes).
        header_length: the length of the header it was remembered from (ids of other lengths move the tensors).
        outputs / binary_output / priority / timeout_us / sequence: as parsed
            (``outputs``: :class:`~.protocol.RequestedOutput` s, ``sequence``: a
            :class:`~.protocol.SequenceFlags` or None; typed loosely because :mod:`.protocol`
            imports this module, not the other way round).
    """

    inputs: tuple[BinaryInput, ...]
    body_length: int
    header_length: int
    outputs: tuple[Any, ...]
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


_ID_MEMBERS = (b'{"id": "', b'{"id":"')
"""The request id as the header's first member, as ``json.dumps`` writes it (tritonclient, ``streamrt perf``)
and compactly."""


def without_request_id(header: bytes) -> tuple[bytes, str] | None:
    """(``header`` without its leading ``"id"`` member, the id), or (``header``, "") when it does not start with
    one; None when the id cannot be read from the bytes as they are (JSON escapes or control characters, not
    UTF-8, no member after it): such a header takes the full parse."""
    if not header.startswith(b'{"id"'):  # most headers: one check
        return header, ""
    for prefix in _ID_MEMBERS:
        if not header.startswith(prefix):
            continue
        end = header.find(b'"', len(prefix))
        value = header[len(prefix):end]
        if end < 0 or b"\\" in value or any(byte < 0x20 for byte in value):
            return None
        rest = header[end + 1:]
        rest = rest[2:] if rest.startswith(b", ") else rest[1:] if rest.startswith(b",") else b""
        if not rest:
            return None
        try:
            return b"{" + rest, value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return header, ""
