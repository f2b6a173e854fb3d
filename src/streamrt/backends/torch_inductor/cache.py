"""Inductor's compile cache: where ``TORCHINDUCTOR_CACHE_DIR`` points while a plan builds."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["inductor_cache"]


@contextlib.contextmanager
def inductor_cache(cache_dir: Path) -> Iterator[None]:
    """Inductor's compile cache under ``cache_dir/inductor`` for the duration of a build.

    A ``TORCHINDUCTOR_CACHE_DIR`` the user set wins; otherwise the variable is set and restored.
    """
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    try:
        yield
    finally:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
