"""Model directories sent in a load request (Triton's ``file:<path>`` load parameters).

``tritonclient``'s ``load_model(name, config=..., files={"file:1/model.onnx": data})`` sends the
files of a whole model directory; the model is then loaded from them instead of from the
repository (the repository directory is left untouched), and the directory lives until the
model is unloaded or loaded again. As in Triton, the files need the ``config`` override.

Example:
    >>> folder = write_model_files({"file:1/model.onnx": b"..."})   # doctest: +SKIP
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from streamrt.errors import RequestError

__all__ = ["FILE_PREFIX", "remove_model_files", "write_model_files"]

FILE_PREFIX = "file:"
_NAME_MAX = 255  # bytes in one path component (Linux NAME_MAX)


def write_model_files(files: Mapping[str, bytes]) -> Path:
    """Write ``{"file:<relative path>": content}`` into a new private directory and return it.

    Raises:
        RequestError: a path that is absolute, empty, leaves the directory (``..``), has a component
            longer than 255 bytes, or cannot be written (Triton's ``Invalid file path``, 400 /
            INVALID_ARGUMENT: the request is wrong, and the server goes on serving).
    """
    folder = Path(tempfile.mkdtemp(prefix="streamrt-model-"))
    try:
        for key, content in files.items():
            relative = PurePosixPath(key.removeprefix(FILE_PREFIX))
            if not relative.parts or relative.is_absolute() or ".." in relative.parts:
                raise RequestError(f"load parameter '{key}': the path must be relative inside the model directory")
            if any(len(part.encode()) > _NAME_MAX for part in relative.parts):
                raise RequestError(f"Invalid file path: load parameter '{key[:64]}...' has a path component "
                                   f"longer than {_NAME_MAX} bytes")
            target = folder.joinpath(*relative.parts)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
            except OSError as exc:
                raise RequestError(f"Invalid file path: load parameter '{key}': {exc.strerror}") from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def remove_model_files(folder: Path | None) -> None:
    """Delete a directory made by :func:`write_model_files` (None: nothing to do)."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
