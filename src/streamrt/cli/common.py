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
from streamrt.plan import is_plan_file

__all__ = [
    "add_build_arguments",
    "config_from_args",
    "engine_from_path",
    "parse_options",
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


def stderr_progress(line: str) -> None:
    """Build progress for the terminal: one line per step on stderr."""
    print(f"  · {line}", file=sys.stderr, flush=True)


def engine_from_path(path: Path, args: argparse.Namespace, prefix: str = "") -> Any:
    """Load a plan, or build an ONNX file through the cache (with the flags in ``args``) and load it."""
    import streamrt

    if is_plan_file(path):
        return streamrt.load(path)
    result = streamrt.build(
        path,
        config_from_args(args, prefix),
        cache=CacheArgs.use_cache(args),
        cache_dir=CacheArgs.cache_dir(args),
        progress=stderr_progress,
    )
    return streamrt.load(result.path)
