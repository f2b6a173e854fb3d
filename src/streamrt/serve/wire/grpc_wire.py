"""The protobuf wire form of ``ModelInferRequest`` / ``ModelInferResponse`` tensors, without copies.

protobuf copies every ``bytes`` field twice on the way in (into its arena when parsing, then into a
new ``bytes`` object on each access of ``raw_input_contents``) and twice on the way out (the array's
``tobytes`` and the message's ``SerializeToString``). For a 4.8 MB request that is most of the
server's time. The gRPC front end therefore takes the request's serialized bytes (gRPC's one copy,
out of its slice buffers) and:

* :func:`split_infer_request` walks the message's top-level fields (a few varints), hands the
  small fields to protobuf and returns ``raw_input_contents`` as zero-copy ``memoryview`` slices,
  which :func:`numpy.frombuffer` turns into the input arrays;
* :func:`encode_infer_response` serializes the response without its tensors and appends each
  ``raw_output_contents`` entry (tag, length, data) in one ``b"".join``: one copy of each output.

The wire format is protobuf's (``https://protobuf.dev/programming-guides/encoding/``); the field
numbers are those of ``kserve_v2.proto`` (raw_input_contents = 7, raw_output_contents = 6).

Example:
    >>> from streamrt.serve.wire.proto import messages
    >>> m = messages.ModelInferRequest(model_name="m", raw_input_contents=[b"abcd"])
    >>> rest, raw = split_infer_request(m.SerializeToString())
    >>> messages.ModelInferRequest.FromString(rest).model_name, [bytes(r) for r in raw]
    ('m', [b'abcd'])
"""

from __future__ import annotations

from collections.abc import Sequence

from streamrt.errors import RequestError

__all__ = ["RAW_INPUT_TAG", "encode_infer_response", "encode_length_delimited", "encode_varint", "read_varint",
           "split_infer_request"]

_RAW_INPUT_FIELD = 7
RAW_INPUT_TAG = bytes([(_RAW_INPUT_FIELD << 3) | 2])
"""The tag of one ``raw_input_contents`` entry (field 7, length-delimited)."""
_RAW_OUTPUT_TAG = bytes([(6 << 3) | 2])  # field 6, wire type 2 (length-delimited)


def read_varint(data: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """(the protobuf varint at ``pos``, the position after it); RequestError when it runs past ``end``."""
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise RequestError("malformed ModelInferRequest: truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def encode_varint(value: int) -> bytes:
    """A protobuf base-128 varint."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def split_infer_request(data: bytes) -> tuple[bytes, list[memoryview]]:
    """``(the message without raw_input_contents, views of each raw_input_contents entry)``.

    Raises:
        RequestError: the bytes are not a well-formed message.
    """
    view = memoryview(data)
    end = len(data)
    raw: list[memoryview] = []
    kept: list[list[int]] = []  # [start, end) byte ranges of the other fields, adjacent ones merged
    pos = 0
    while pos < end:
        start = pos
        key, pos = read_varint(data, pos, end)
        wire = key & 7
        if wire == 0:
            _, pos = read_varint(data, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = read_varint(data, pos, end)
            if key >> 3 == _RAW_INPUT_FIELD and pos + length <= end:
                raw.append(view[pos : pos + length])
                pos += length
                continue
            pos += length
        else:
            raise RequestError(f"malformed ModelInferRequest: unsupported wire type {wire}")
        if pos > end:
            raise RequestError("malformed ModelInferRequest: a field runs past the end of the message")
        if kept and kept[-1][1] == start:
            kept[-1][1] = pos
        else:
            kept.append([start, pos])
    if len(kept) == 1:
        return bytes(view[kept[0][0] : kept[0][1]]), raw
    return b"".join(view[a:b] for a, b in kept), raw


def encode_infer_response(header: bytes, tensors: Sequence[memoryview | bytes]) -> bytes:
    """``header`` (a serialized ``ModelInferResponse`` without raw_output_contents) + each tensor as
    one ``raw_output_contents`` entry, in one copy."""
    parts: list[bytes | memoryview] = [header]
    for tensor in tensors:
        parts += (_RAW_OUTPUT_TAG, encode_varint(tensor.nbytes if isinstance(tensor, memoryview) else len(tensor)),
                  tensor)
    return b"".join(parts)


def encode_length_delimited(field: int, data: bytes) -> bytes:
    """One length-delimited field (an embedded message or bytes): tag, length, ``data``."""
    return b"".join((encode_varint((field << 3) | 2), encode_varint(len(data)), data))
