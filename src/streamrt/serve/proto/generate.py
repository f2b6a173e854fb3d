"""Regenerate ``_descriptor.py`` from ``kserve_v2.proto`` (needs ``grpcio-tools``; run by hand).

The package embeds the compiled ``FileDescriptorProto`` instead of protoc's ``_pb2.py``: the
messages are built in a private descriptor pool at import time, so the server (a) works with any
protobuf runtime >= 4.25 (generated ``_pb2`` files pin the runtime to protoc's major version) and
(b) can share a process with tritonclient, whose own ``inference.*`` messages live in the default
pool (two files defining the same symbols in one pool refuse to load).

Usage:
    python -m streamrt.serve.proto.generate
"""

from __future__ import annotations

import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).parent


def main() -> int:
    """Compile the proto and rewrite ``_descriptor.py``; returns the exit status."""
    try:
        from grpc_tools import protoc
    except ImportError:
        sys.stderr.write("grpcio-tools is required: pip install grpcio-tools\n")
        return 2
    from google.protobuf import descriptor_pb2

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.bin"
        code = protoc.main(["protoc", f"-I{HERE}", f"--descriptor_set_out={out}", str(HERE / "kserve_v2.proto")])
        if code != 0:
            return int(code)
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    blob = files[0].SerializeToString(deterministic=True)
    body = "\n".join(f"    {line!r}" for line in _chunks(blob))
    (HERE / "_descriptor.py").write_text(
        textwrap.dedent('''\
        # ruff: noqa: E501
        """Compiled ``kserve_v2.proto`` (a serialized FileDescriptorProto). Generated: do not edit.

        Regenerate with ``python -m streamrt.serve.proto.generate``.
        """

        SERIALIZED = (
        ''')
        + body
        + "\n)\n"
    )
    print(f"wrote {HERE / '_descriptor.py'} ({len(blob)} bytes of descriptor)")
    return 0


def _chunks(blob: bytes, size: int = 72) -> list[bytes]:
    return [blob[i : i + size] for i in range(0, len(blob), size)]


if __name__ == "__main__":
    sys.exit(main())
