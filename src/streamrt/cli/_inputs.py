"""Input flags shared by ``bench``, ``compare`` and ``profile``: shapes, batch, data file, seed.

Random data by default (never zeros), or ``--inputs FILE.npz`` with one array per input name.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from streamrt.errors import ConfigError
from streamrt.onnx.profiles import parse_shape_list
from streamrt.running.inputs import DISTRIBUTIONS, load_inputs, random_inputs, resolve_shapes, shapes_of
from streamrt.types import format_shape

__all__ = ["add_input_arguments", "describe_inputs", "inputs_from_args"]


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--shapes``, ``--batch``, ``--inputs``, ``--seed`` and ``--distribution``."""
    group = parser.add_argument_group("inputs")
    group.add_argument(
        "--shapes", metavar="SPECS", help="name:1x3x224x224,... shapes to run at (default: opt shapes of profile 0)"
    )
    group.add_argument("--batch", type=int, metavar="N", help="leading dimension of dynamic-batch inputs")
    group.add_argument(
        "--inputs",
        type=Path,
        metavar="FILE.npz",
        help="input data, one array per input name (default: fresh random data)",
    )
    group.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    group.add_argument(
        "--distribution",
        choices=DISTRIBUTIONS,
        default="normal",
        help="random float inputs: standard normal or uniform in [0, 1) (default normal)",
    )


def inputs_from_args(engine: Any, args: argparse.Namespace) -> tuple[dict[str, np.ndarray], str]:
    """Host arrays for ``engine`` from the flags, and a one-line description of where they came from."""
    if args.inputs is not None:
        if args.shapes or args.batch is not None:
            raise ConfigError("--inputs fixes the shapes; drop --shapes and --batch")
        arrays = load_inputs(args.inputs, engine.inputs)
        engine.validate(arrays)
        return arrays, f"from {args.inputs}"
    shapes = resolve_shapes(
        engine.inputs,
        engine.profiles,
        shapes=parse_shape_list(args.shapes) if args.shapes else None,
        batch=args.batch,
    )
    rng = np.random.default_rng(args.seed)
    arrays = random_inputs(engine.inputs, shapes, rng, distribution=args.distribution)
    return arrays, f"random {args.distribution} (seed {args.seed})"


def describe_inputs(arrays: dict[str, np.ndarray]) -> str:
    """``x=8x3x32x32 float32, ...``."""
    return ", ".join(f"{n}={format_shape(s)} {arrays[n].dtype}" for n, s in shapes_of(arrays).items())
