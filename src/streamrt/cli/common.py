"""Helpers shared by the subcommands that build (build, bench, compare, profile...).

The build flags themselves are declared once in :mod:`streamrt.cli.args` (``BuildArgs``);
``--config FILE`` loads the same fields from YAML/JSON and flags given on the command line
override it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from streamrt.cli.args import BuildArgs, CacheArgs, parse_options
from streamrt.config import BuildConfig
from streamrt.errors import ConfigError, ModelNotFoundError
from streamrt.plan import is_plan_file

__all__ = [
    "add_build_arguments",
    "check_output",
    "config_from_args",
    "engine_from_path",
    "parse_options",
    "require_file",
    "stderr_progress",
]


def add_build_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """Add the build flags (:class:`BuildArgs`) and, without a prefix, the cache flags.

    ``prefix`` (e.g. ``"a-"``) adds per-side ``--a-backend``/``--a-precision`` for ``compare``.
    """
    BuildArgs(prefix).add_to(parser)
    if not prefix:
        CacheArgs().add_to(parser)


def config_from_args(args: argparse.Namespace, prefix: str = "") -> BuildConfig:
    """A BuildConfig from ``--config`` (if any) overridden by the flags given (and the side's, with a prefix)."""
    return BuildArgs(prefix).config(args)


def check_output(path: Path, *, directory: bool = False, example: str = "", flag: str = "-o") -> None:
    """Refuse an output path that cannot be written before any work is done (one line, a hint).

    ``directory``: the command writes several files into ``path``; else ``path`` is one file and
    ``example`` names a file to suggest when ``path`` is a folder. ``flag`` is the option that
    gave ``path``, named in the hint.
    """
    import os

    if not directory and path.is_dir():
        raise ConfigError(f"output {path} is a directory",
                          hint=f"{flag} {path / example}" if example else f"{flag} FILE")
    if directory and path.exists() and not path.is_dir():
        raise ConfigError(f"output {path} is a file, not a directory", hint=f"{flag} DIR with a new or existing folder")
    nearest = path if path.exists() else next(p for p in path.parents if p.exists())
    if nearest is not path and not nearest.is_dir():
        raise ConfigError(f"cannot write {path}: {nearest} is a file, not a folder", hint=f"{flag} PATH in a folder")
    if _read_only(nearest):
        raise ConfigError(f"cannot write {path}: {nearest} is on a read-only file system",
                          hint=f"{flag} PATH on a writable file system")
    if not os.access(nearest, os.W_OK):
        raise ConfigError(f"cannot write {path}: permission denied", hint=f"{flag} PATH in a folder you can write to")


def _read_only(path: Path) -> bool:
    """True when ``path`` lies on a file system mounted read-only (EROFS, not a permission)."""
    import os

    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows): the write itself will say
        return False


def require_file(path: Path) -> None:
    """A missing model or plan, in the same words for every subcommand (build, inspect, bench, ...)."""
    if not path.exists():
        raise ModelNotFoundError(f"file not found: {path}", hint="check the path: give an ONNX model or a plan file")


def stderr_progress(line: str) -> None:
    """Build progress for the terminal: one line per step on stderr."""
    print(f"  · {line}", file=sys.stderr, flush=True)


def engine_from_path(path: Path, args: argparse.Namespace, prefix: str = "", profiles: tuple[Any, ...] = ()) -> Any:
    """Load a plan, or build an ONNX file through the cache (with the flags in ``args``) and load it.

    ``profiles`` are used when neither the flags nor ``--config`` give any (e.g. the shapes of
    ``compare --inputs`` data).
    """
    import streamrt

    require_file(path)
    # A plan is loaded as it is: its build flags are not even read (a plan needs no --config).
    config = None
    if not is_plan_file(path):
        config = config_from_args(args, prefix)
        if profiles and not config.profiles:
            config = config.replace(profiles=tuple(profiles))
    return streamrt.open(
        path,
        config,
        cache=CacheArgs.use_cache(args),
        cache_dir=CacheArgs.cache_dir(args),
        progress=stderr_progress,
    )
