"""Regenerate the embedded descriptors from the ``.proto`` files (needs ``grpcio-tools``; run by hand).

``kserve_v2.proto`` -> ``_descriptor.py`` and ``model_config.proto`` -> ``_model_config_descriptor.py``,
each a module holding one serialized ``FileDescriptorProto`` as ``SERIALIZED``.

The package embeds the compiled ``FileDescriptorProto`` instead of protoc's ``_pb2.py``: the
messages are built in a private descriptor pool at import time, so the server (a) works with any
protobuf runtime >= 4.25 (generated ``_pb2`` files pin the runtime to protoc's major version) and
(b) can share a process with tritonclient, whose own ``inference.*`` messages live in the default
pool (two files defining the same symbols in one pool refuse to load).

Usage:
    python -m streamrt.serve.wire.proto.generate
"""

from __future__ import annotations

import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).parent

# Dependencies first: the pool needs model_config.proto before kserve_v2.proto imports it.
TARGETS = {"model_config.proto": "_model_config_descriptor.py", "kserve_v2.proto": "_descriptor.py"}


def main() -> int:
    """Compile the protos and rewrite the descriptor modules; returns the exit status."""
    try:
        from grpc_tools import protoc
    except ImportError:
        sys.stderr.write("grpcio-tools is required: pip install grpcio-tools\n")
        return 2
    from google.protobuf import descriptor_pb2

    for proto, module in TARGETS.items():
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "set.bin"
            code = protoc.main(["protoc", f"-I{HERE}", f"--descriptor_set_out={out}", str(HERE / proto)])
            if code != 0:
                return int(code)
            files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
        blob = files[0].SerializeToString(deterministic=True)
        body = "\n".join(f"    {line!r}" for line in _chunks(blob))
        (HERE / module).write_text(
            textwrap.dedent(f'''\
            # ruff: noqa: E501
            """Compiled ``{proto}`` (a serialized FileDescriptorProto). Generated: do not edit.

            Regenerate with ``python -m streamrt.serve.wire.proto.generate``.
            """

            SERIALIZED = (
            ''')
            + body
            + "\n)\n"
        )
        print(f"wrote {HERE / module} ({len(blob)} bytes of descriptor)")
    return 0


def _chunks(blob: bytes, size: int = 72) -> list[bytes]:
    return [blob[i : i + size] for i in range(0, len(blob), size)]


if __name__ == "__main__":
    sys.exit(main())
