"""The tensor channel between a front-end worker and the engine process, and its messages.

One connected Unix socket pair per worker (created by the engine process, one end passed to the
worker). Each frame is a 4-byte little-endian length and a pickled tuple of plain values (ints,
strings, tuples, small ``bytes``): tensors never travel in it unless the arena is full. pickle
over a private socket pair between processes of one server is trusted; nothing else reaches it.
Many requests are in flight on one channel at once; replies carry the request's number.

Messages (first element the kind):

* worker → engine: ``(HELLO, pid)``; ``(INFER, rid, model, version, id, priority, timeout_us,
  binary_output, received_ns, inputs, outputs, sequence, trace_parent)`` (``sequence``: the
  request's :class:`~streamrt.serve.wire.protocol.SequenceFlags` or None; ``trace_parent``: its W3C
  traceparent or None); ``(FREE, offsets)`` (output blocks it is done with).
* engine → worker: ``(OK, rid, model, version, id, outputs, in_shared_memory)``;
  ``(ERROR, rid, error class name, message, hint)``; ``(STOP,)`` (stop serving and exit).

A tensor's place (``where``): ``("a", offset, nbytes)`` in the arena, ``("b", bytes)`` inline,
``("r", region, offset, byte_size)`` in a client's registered shared-memory region (resolved by
the engine process, which holds the registry).
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

import streamrt.errors as errors_module
from streamrt.errors import ServeError, StreamRTError

__all__ = ["ERROR", "FREE", "HELLO", "INFER", "OK", "STOP", "FrameReader", "FrameWriter", "error_message",
           "raise_error"]

HELLO, INFER, FREE = 0, 1, 2
OK, ERROR, STOP = 10, 11, 12

_LENGTH = struct.Struct("<I")


class FrameWriter:
    """Frames queued during one event-loop iteration leave in one write (one system call under load,
    instead of one per message)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._parts: list[bytes] = []

    def send(self, message: tuple[Any, ...]) -> None:
        body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if not self._parts:
            asyncio.get_running_loop().call_soon(self._flush)
        self._parts += (_LENGTH.pack(len(body)), body)

    def _flush(self) -> None:
        parts, self._parts = self._parts, []
        if not self.writer.is_closing():
            self.writer.write(b"".join(parts))

    def is_closing(self) -> bool:
        return self.writer.is_closing()

    def close(self) -> None:
        if self._parts:
            self._flush()
        self.writer.close()


class FrameReader:
    """The messages that have arrived, as many as one read brings (one await per read, not two per
    message: under load a read holds the frames of many requests).

    Example:
        >>> while (messages := await frames.read()) is not None:   # doctest: +SKIP
        ...     for message in messages: handle(message)
    """

    READ_BYTES = 1 << 20

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self._buffer = bytearray()

    async def read(self) -> list[tuple[Any, ...]] | None:
        """The next complete messages (at least one), or None at the end of the stream (the other
        process is gone; a partial message left then is dropped)."""
        while True:
            messages = self._parse()
            if messages:
                return messages
            try:
                chunk = await self.reader.read(self.READ_BYTES)
            except ConnectionError:
                return None
            if not chunk:
                return None
            self._buffer += chunk

    def _parse(self) -> list[tuple[Any, ...]]:
        buffer, start, messages = self._buffer, 0, []
        view = memoryview(buffer)
        try:
            while len(buffer) - start >= 4:
                (size,) = _LENGTH.unpack_from(buffer, start)
                if len(buffer) - start - 4 < size:
                    break
                messages.append(pickle.loads(view[start + 4 : start + 4 + size]))
                start += 4 + size
        finally:
            view.release()
        if start:
            del buffer[:start]
        return messages


def error_message(rid: int, exc: BaseException) -> tuple[Any, ...]:
    """The ERROR reply for ``exc`` (its class name travels, so the worker answers the same status)."""
    if isinstance(exc, StreamRTError):
        return ERROR, rid, type(exc).__name__, exc.message, exc.hint
    return ERROR, rid, "InferenceError", f"{type(exc).__name__}: {exc}", None


def raise_error(name: str, message: str, hint: str | None) -> None:
    """Raise the StreamRT error an ERROR reply names (ServeError if the name is not one of ours)."""
    kind = getattr(errors_module, name, None)
    if not (isinstance(kind, type) and issubclass(kind, StreamRTError)):
        kind = ServeError
    exc = kind.__new__(kind)  # some classes have their own constructors: set message and hint directly
    StreamRTError.__init__(exc, message, hint=hint)
    raise exc
