"""Remembered gRPC inference messages: decode each request shape and write each reply shape once.

A client sends the same ``ModelInferRequest`` for every request of one shape, apart from the tensor
bytes in ``raw_input_contents`` (tritonclient and ``streamrt perf`` write it from the model name,
each input's name, datatype and shape), and a model answers each such request with outputs of one
shape. Parsing the request with protobuf and walking its fields (names, dtypes, shapes, counts,
parameters, sequence flags) was ~14 us of a 64 B request, and building the reply message ~4.5 us
(in isolation, ``benchmarks/vs_triton.py``'s null model); looked up, the two take ~2 and ~1 us.

:class:`GrpcRequestLayout` is what the rest of a request (the message without its raw contents, as
:func:`~.grpc_wire.split_infer_request` returns it) said once it was decoded: each input's name,
dtype, shape and byte size, the requested outputs and the request-level fields. The gRPC listener
keeps one per rest it decoded that names only raw, non-BYTES inputs, no tensor or output parameters
(so no shared memory or classification) and no sequence, keyed by those bytes and the element limit
they were checked against: nothing in such a request depends on anything but the rest's bytes. A
request whose rest is known and whose raw entries have the sizes the layout implies skips the
parse; anything else takes the full decode, which raises the same errors as before.

Request-level parameters are allowed (the layout keeps the priority and timeout they gave):
perf_analyzer sends ``triton_enable_empty_final_response`` with every gRPC request, and while any
parameter kept a rest out of the table each of its requests took the full decode (~40% of the event
loop's time per 64 B request, docs/benchmarks/2026-12-07-small-request-cpu.md). A sequence's
requests stay out: their rests differ by sequence id and flags, so they would only churn the table.

Reply headers (``model_name``, ``model_version`` and ``outputs``, the message without its ``id``
and raw contents) are kept for replies whose outputs are all non-BYTES and not in shared memory;
the id goes between the two parts as protobuf's field order puts it, so the bytes are those
``SerializeToString`` writes.

The request's ``id`` is not part of the layout: clients that number their requests (tritonclient's
``request_id``, ``streamrt perf --profile-export-file``) send a new id every time, and with it in the key every
request was a rest not seen before (the full decode, and a table churned until it was cleared). Protobuf's
serializers write fields in number order, so the id (field 3) follows ``model_name`` and ``model_version``
(fields 1 and 2) at the front of the message; :func:`_id_field` finds it there, the tables are keyed by
the message without it, and each request gets its own id back. An id written anywhere else stays in
the key, as before.

A known request is found without splitting it too: the rest followed by the raw entries, each
framed as protobuf writes field 7 (``raw_input_contents`` is the message's last field, so
tritonclient's and protobuf's serializers put the entries last), has one total size per layout;
:func:`known_whole_request` looks the size up and compares the rest and the frames' tags and
lengths in place. A message laid out otherwise (or another layout of the same size) takes the split.

The tables are :class:`~.http_headers.BoundedTable` s (cleared when full; rests over
:data:`~.http_headers.MAX_HEADER_BYTES` are never kept).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamrt.errors import RequestError
from streamrt.serve.wire.grpc_wire import RAW_INPUT_TAG as _RAW_INPUT_TAG
from streamrt.serve.wire.grpc_wire import encode_varint, read_varint
from streamrt.serve.wire.http_headers import MAX_HEADER_BYTES, BoundedTable
from streamrt.serve.wire.protocol import InferRequest, InferResponse, RequestedOutput, kserve_dtype

__all__ = ["GrpcRequestLayout", "RawInput", "known_request", "known_whole_request", "remember_request",
           "reply_header"]


@dataclass(frozen=True)
class RawInput:
    """One raw input of a decoded request: ``count`` elements of ``dtype`` in ``nbytes`` bytes."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    count: int
    nbytes: int


@dataclass(frozen=True)
class GrpcRequestLayout:
    """What the rest of a request (its message without ``raw_input_contents``) said once decoded."""

    model: str
    version: str
    inputs: tuple[RawInput, ...]
    outputs: tuple[RequestedOutput, ...]
    priority: int = 0
    timeout_us: int = 0


_REQUESTS: BoundedTable[GrpcRequestLayout] = BoundedTable()
"""Decoded request rests by (rest bytes, max_elements)."""

_WHOLE: BoundedTable[tuple[bytes, tuple[tuple[int, bytes, int], ...], GrpcRequestLayout]] = BoundedTable()
"""(rest, each raw entry's (offset of its frame, the frame's tag and length bytes, data offset), layout) by
(total message size, max_elements)."""

_REPLIES: BoundedTable[tuple[bytes, bytes]] = BoundedTable()
"""(fields 1-2, field 5) of reply messages by (model, version, each output's name, dtype and shape)."""


_LEADING_TAGS = (0x0A, 0x12)
"""``model_name`` and ``model_version`` (fields 1 and 2, length-delimited): what protobuf writes before the id."""
_ID_TAG = 0x1A
"""``id`` (field 3, length-delimited)."""


def _id_field(data: bytes | memoryview, end: int) -> tuple[int, int, int] | None:
    """(start, value start, end) of the ``id`` field where protobuf's serializers put it (after
    ``model_name`` and ``model_version``, the first fields of a message), or None when it is not there.
    Lengths under 128 (one varint byte) are read in place: this runs for every request."""
    pos = 0
    try:
        for tag in _LEADING_TAGS:
            if pos < end and data[pos] == tag:
                length = data[pos + 1]
                if length < 0x80:
                    pos += 2 + length
                else:
                    length, pos = read_varint(data, pos + 1, end)
                    pos += length
        if pos >= end or data[pos] != _ID_TAG:
            return None
        length = data[pos + 1]
        if length < 0x80:
            value = pos + 2
        else:
            length, value = read_varint(data, pos + 1, end)
    except (IndexError, RequestError):  # a message shorter than its first fields say
        return None
    return (pos, value, value + length) if value + length <= end else None


def _without_id(rest: bytes) -> tuple[bytes, str] | None:
    """(``rest`` without its id field, the id); None when the id is not valid UTF-8 (protobuf refuses it)."""
    field = _id_field(rest, len(rest))
    if field is None:
        return rest, ""
    start, value, end = field
    try:
        return rest[:start] + rest[end:], rest[value:end].decode("utf-8")
    except UnicodeDecodeError:
        return None


def known_whole_request(data: bytes | memoryview, max_elements: int) -> InferRequest | None:
    """The request of a whole message laid out as one decoded before (its rest, then its raw entries
    framed as protobuf writes them; any id), inputs zero-copy views of ``data``; None otherwise."""
    view = memoryview(data)
    field = _id_field(view, min(len(view), MAX_HEADER_BYTES))
    cut = 0 if field is None else field[2] - field[0]
    entry = _WHOLE.get((len(view) - cut, max_elements))
    if entry is None:
        return None
    rest, frames, layout = entry
    request_id = ""
    if field is None:
        if view[:len(rest)] != rest:
            return None
    else:
        start, value, end = field
        if view[:start] != rest[:start] or view[end:len(rest) + cut] != rest[start:]:
            return None
        try:
            request_id = str(view[value:end], "utf-8")
        except UnicodeDecodeError:
            return None
    for at, head, _ in frames:
        if view[at + cut:at + cut + len(head)] != head:
            return None
    return _request(layout, [view[at + cut:at + cut + t.nbytes]
                             for (_, _, at), t in zip(frames, layout.inputs, strict=True)], request_id)


def known_request(rest: bytes, raw: Sequence[memoryview], max_elements: int) -> InferRequest | None:
    """The request of a rest decoded before (any id), its inputs zero-copy views of ``raw``; None when
    the rest is not known or the raw entries are not the sizes it implies."""
    key = _without_id(rest)
    layout = None if key is None else _REQUESTS.get((key[0], max_elements))
    if layout is None or len(raw) != len(layout.inputs):
        return None
    for data, tensor in zip(raw, layout.inputs, strict=True):
        if data.nbytes != tensor.nbytes:
            return None
    assert key is not None
    return _request(layout, raw, key[1])


def _request(layout: GrpcRequestLayout, raw: Sequence[memoryview], request_id: str) -> InferRequest:
    return InferRequest(
        model=layout.model, version=layout.version, id=request_id,
        inputs={t.name: np.ndarray(t.shape, t.dtype, data) for data, t in zip(raw, layout.inputs, strict=True)},
        outputs=layout.outputs, priority=layout.priority, timeout_us=layout.timeout_us,
    )


def remember_request(rest: bytes, message: Any, request: InferRequest, max_elements: int) -> None:
    """Keep the layout of ``request`` (decoded from ``message``, the protobuf of ``rest``) when
    nothing in it depends on more than the rest's bytes: raw non-BYTES inputs, no tensor or output
    parameters, no sequence."""
    if len(rest) > MAX_HEADER_BYTES or request.sequence is not None:
        return
    inputs = []
    for tensor in message.inputs:
        if tensor.parameters or tensor.datatype == "BYTES":
            return
        array = request.inputs[tensor.name]
        inputs.append(RawInput(tensor.name, array.dtype, array.shape, array.size, array.nbytes))
    if not inputs or len(inputs) != len(request.inputs) or any(o.parameters for o in message.outputs):
        return
    key = _without_id(rest)
    if key is None or key[1] != request.id:  # an id elsewhere in the message stays part of the rest
        return
    rest = key[0]
    layout = GrpcRequestLayout(request.model, request.version, tuple(inputs), request.outputs,
                               request.priority, request.timeout_us)
    _REQUESTS.put((rest, max_elements), layout)
    frames, at = [], len(rest)
    for tensor in inputs:
        head = _RAW_INPUT_TAG + encode_varint(tensor.nbytes)
        frames.append((at, head, at + len(head)))
        at += len(head) + tensor.nbytes
    _WHOLE.put((at, max_elements), (rest, tuple(frames), layout))


def reply_header(response: InferResponse, messages: Callable[[], Any]) -> tuple[bytes, bytes] | None:
    """(``model_name`` + ``model_version``, ``outputs``) of the serialized reply, written once per
    output signature; None for a reply with BYTES outputs or outputs in shared memory. ``messages``
    gives the protobuf classes (called only for a signature not seen before)."""
    if response.in_shared_memory:
        return None
    outputs = response.outputs
    key = (response.model, response.version, tuple([(n, a.dtype, a.shape) for n, a in outputs.items()]))
    parts = _REPLIES.get(key)
    if parts is not None:
        return parts
    if any(a.dtype.kind in "OSU" for a in outputs.values()):
        return None
    proto = messages()
    head = proto.ModelInferResponse(model_name=response.model, model_version=response.version)
    body = proto.ModelInferResponse()
    for name, array in outputs.items():
        body.outputs.add(name=name, datatype=kserve_dtype(array), shape=list(array.shape))
    parts = (head.SerializeToString(), body.SerializeToString())
    _REPLIES.put(key, parts)
    return parts
