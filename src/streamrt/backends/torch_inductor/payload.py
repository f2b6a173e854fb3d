"""The torch_inductor plan payload: one stored (uncompressed) zip of ``.pt2`` packages.

Layout: ``meta.json`` (``{"inputs": [names]}``) and ``profile_<i>.pt2`` per shape profile.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from streamrt.errors import PlanFormatError

__all__ = ["extract_payload", "pack_payload"]


def pack_payload(packages: Sequence[bytes], meta: Mapping[str, Any]) -> bytes:
    """One zip (stored, uncompressed) holding ``profile_<i>.pt2`` per profile and ``meta.json``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("meta.json", json.dumps(dict(meta), sort_keys=True))
        for i, data in enumerate(packages):
            zf.writestr(f"profile_{i}.pt2", data)
    return buffer.getvalue()


def extract_payload(payload: bytes, profiles: int, folder: Path) -> tuple[dict[str, Any], list[Path]]:
    """Write each profile's ``.pt2`` into ``folder``; return ``meta.json`` and the package paths.

    Raises:
        PlanFormatError: the zip is malformed or lacks a member.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as zf:
            meta = json.loads(zf.read("meta.json"))
            packages = []
            for i in range(profiles):
                path = folder / f"profile_{i}.pt2"
                path.write_bytes(zf.read(f"profile_{i}.pt2"))
                packages.append(path)
    except (KeyError, zipfile.BadZipFile, ValueError) as exc:
        raise PlanFormatError(f"torch_inductor payload is malformed: {exc}") from exc
    return meta, packages
