"""The tensor channel's framing: messages split over reads, many in one read, one larger than a
read, and a message cut short when the other process dies."""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

import numpy as np

from streamrt.serve.listeners.frontends.channel import FrameReader, FrameWriter


def _frame(message: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return struct.pack("<I", len(body)) + body


def _read_all(chunks: list[bytes], read_bytes: int = 1 << 20) -> tuple[list[list[tuple[Any, ...]]], bool]:
    async def run() -> tuple[list[list[tuple[Any, ...]]], bool]:
        reader = asyncio.StreamReader()
        for chunk in chunks:
            reader.feed_data(chunk)
        reader.feed_eof()
        frames = FrameReader(reader)
        frames.READ_BYTES = read_bytes
        reads = []
        while (messages := await frames.read()) is not None:
            reads.append(messages)
        return reads, not frames._buffer

    return asyncio.run(run())


def test_messages_split_anywhere_arrive_whole_and_in_order() -> None:
    rng = np.random.default_rng(7)
    messages = [(1, i, "m", rng.bytes(int(rng.integers(0, 300)))) for i in range(200)]
    stream = b"".join(_frame(m) for m in messages)
    cuts = sorted(rng.choice(len(stream), 60, replace=False).tolist())
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    for read_bytes in (1, 7, 4096, 1 << 20):
        reads, empty = _read_all(chunks, read_bytes)
        assert [m for batch in reads for m in batch] == messages
        assert empty and all(reads)
    reads, _ = _read_all([stream])
    assert len(reads) == 1  # one read brought them all: handed over at once


def test_a_message_larger_than_a_read_and_a_message_cut_short() -> None:
    big = (11, 3, np.arange(3 << 20, dtype=np.uint8).tobytes())
    reads, _ = _read_all([_frame(big), _frame((2, [64]))], read_bytes=1 << 16)
    assert [m for batch in reads for m in batch] == [big, (2, [64])]
    whole, cut = _frame((1, 1)), _frame((1, 2, b"x" * 100))
    reads, empty = _read_all([whole + cut[:50]])  # the sender died mid-message
    assert reads == [[(1, 1)]] and not empty


def test_writer_and_reader_over_a_socket_pair() -> None:
    async def run() -> list[tuple[Any, ...]]:
        import socket

        a, b = socket.socketpair()
        _, writer = await asyncio.open_unix_connection(sock=a)
        reader, other = await asyncio.open_unix_connection(sock=b)
        out = FrameWriter(writer)
        sent = [(1, i, b"\0" * (i * 1000)) for i in range(50)]
        for message in sent:
            out.send(message)  # queued in this iteration, written as one
        out.close()
        got: list[tuple[Any, ...]] = []
        frames = FrameReader(reader)
        while (messages := await frames.read()) is not None:
            got += messages
        other.close()
        assert got == sent
        return got

    assert len(asyncio.run(run())) == 50
