"""BYTES tensors in the protocol's binary form: each element as a 4-byte little-endian length and its
bytes, in row-major order (tritonclient's ``serialize_byte_tensor``). The HTTP binary extension,
gRPC's ``raw_input_contents`` and shared-memory regions all hold BYTES this way.

Example:
    >>> import numpy as np
    >>> data = serialize_bytes(np.array([b"ab", b""], dtype=object))
    >>> deserialize_bytes(data, 2, "x").tolist()
    [b'ab', b'']
"""

from __future__ import annotations

import numpy as np

from streamrt.errors import RequestError

__all__ = ["deserialize_bytes", "serialize_bytes"]


def serialize_bytes(array: np.ndarray) -> bytes:
    """A BYTES tensor in the protocol's binary form: each element as a 4-byte little-endian
    length and its bytes, in row-major order (``str`` elements are written as UTF-8)."""
    parts = []
    for item in array.reshape(-1):
        data = item.encode() if isinstance(item, str) else bytes(item)
        parts += [len(data).to_bytes(4, "little"), data]
    return b"".join(parts)


def deserialize_bytes(data: bytes | memoryview, count: int, where: str) -> np.ndarray:
    """``count`` length-prefixed elements of ``data`` as a 1-D object array of ``bytes``.

    Raises:
        RequestError: the lengths do not add up to the data (names the element).
    """
    view = memoryview(data)
    out = np.empty(count, dtype=object)
    offset = 0
    for index in range(count):
        if offset + 4 > len(view):
            raise RequestError(f"{where}: BYTES data ends inside the length of element {index} (of {count})")
        size = int.from_bytes(view[offset : offset + 4], "little")
        offset += 4
        if offset + size > len(view):
            raise RequestError(f"{where}: BYTES element {index} needs {size} bytes, {len(view) - offset} are left")
        out[index] = bytes(view[offset : offset + size])
        offset += size
    if offset != len(view):
        raise RequestError(f"{where}: {len(view) - offset} bytes left after the {count} BYTES elements of the shape")
    return out
