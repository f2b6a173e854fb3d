"""``streamrt compare A B``: run two engines on the same inputs and compare their outputs.

A and B are plans or ONNX models; models are built on the fly through the cache. The shared
build flags apply to both sides, ``--a-backend/--a-precision`` and ``--b-backend/--b-precision``
override them per side, e.g. what int8 costs::

    streamrt compare model.onnx model.onnx --b-precision int8 --calib data/

With ``--inputs data.npz`` and no ``--min/opt/max-shapes``, models are built for exactly the
shapes of the arrays in the file.

Exit status 0 when every output is within ``|a - b| <= atol + rtol * |a|`` (A is the
reference), or with ``--min-cosine C`` when every output's cosine similarity to A is >= C (int8),
1 when one is not, 2 on errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from streamrt.cli._inputs import add_input_arguments, describe_inputs, inputs_from_args
from streamrt.cli.args import BuildArgs
from streamrt.cli.common import add_build_arguments, engine_from_path
from streamrt.plan import is_plan_file

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="compare two backends, precisions or plans on the same inputs (errors, cosine, top-1)",
        description="Run A and B on the same inputs and compare every output in float64. Exit status 1 "
        "when an output is outside |a - b| <= atol + rtol * |a| (A is the reference).",
    )
    parser.add_argument("a", type=Path, metavar="A", help="reference: plan file or ONNX model")
    parser.add_argument("b", type=Path, metavar="B", help="tested: plan file or ONNX model")
    parser.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (default 1e-5)")
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    parser.add_argument(
        "--min-cosine",
        type=float,
        metavar="C",
        help="pass an output when its cosine similarity to A is >= C instead of the tolerances (int8: 0.99)",
    )
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    add_input_arguments(parser)
    add_build_arguments(parser)
    add_build_arguments(parser, prefix="a-")
    add_build_arguments(parser, prefix="b-")
    parser.set_defaults(func=run)


def _profiles_from_inputs(args: argparse.Namespace) -> tuple[Any, ...]:
    """One fixed profile with the shapes of the ``--inputs`` arrays (none without ``--inputs``)."""
    if args.inputs is None:
        return ()
    import zipfile

    import numpy as np

    from streamrt.errors import InputError
    from streamrt.types import ShapeProfile, ShapeRange

    try:
        with np.load(args.inputs, allow_pickle=False) as data:
            shapes = {name: tuple(int(d) for d in data[name].shape) for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InputError(f"cannot read --inputs {args.inputs}: {exc}", hint="pass an .npz file (numpy.savez)") from exc
    return (ShapeProfile({name: ShapeRange.fixed(shape) for name, shape in shapes.items()}),)


def _onnx_input_names(path: Path) -> list[str] | None:
    """The graph inputs of an ONNX file (initializers excluded); None when it cannot be read here."""
    try:
        import onnx

        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # not ONNX, unreadable: the build says so in its own words
        return None
    initializers = {t.name for t in graph.initializer}
    return [i.name for i in graph.input if i.name not in initializers]


def _check_input_names(path: Path, args: argparse.Namespace, profiles: tuple[Any, ...]) -> None:
    """``--inputs`` names that are not the model's: say so, before they become a shape profile
    (which would fail as "profile 0 names input 'wrongname'", about a profile the user never gave)."""
    from streamrt.errors import UnknownInputError

    given = list(profiles[0].ranges) if profiles else []
    expected = _onnx_input_names(path) if given and path.is_file() and not is_plan_file(path) else None
    if expected is None or set(given) == set(expected):
        return
    raise UnknownInputError(
        f"the arrays in --inputs {args.inputs} ({', '.join(given)}) do not match the inputs of {path} "
        f"({', '.join(expected)})",
        hint=f"save one array per model input under its name, e.g. numpy.savez(FILE, {expected[0]}=...)"
        if expected else "this model takes no inputs")


def _side(path: Path, args: argparse.Namespace, side: str) -> Any:
    if is_plan_file(path) and BuildArgs(prefix=f"{side}-").build.given(args):
        print(
            f"streamrt compare: note: {path} is a plan; --{side}-backend/--{side}-precision are ignored",
            file=sys.stderr,
        )
    profiles = _profiles_from_inputs(args)
    _check_input_names(path, args, profiles)
    return engine_from_path(path, args, prefix=f"{side}-", profiles=profiles)


def _label(path: Path, engine: Any) -> str:
    m = engine.manifest
    return f"{path} ({m.backend} {m.backend_version}, {m.precision}, {engine.device_kind})"


def run(args: argparse.Namespace) -> int:
    from streamrt.running.compare import compare_outputs, format_diffs, run_numpy
    from streamrt.running.inputs import cast_inputs

    engine_a = _side(args.a, args, "a")
    with engine_a:
        engine_b = _side(args.b, args, "b")
        with engine_b:
            arrays, source = inputs_from_args(engine_a, args)
            feeds_b = cast_inputs(arrays, engine_b.inputs)
            engine_b.validate(feeds_b)
            out_a = run_numpy(engine_a, arrays)
            out_b = run_numpy(engine_b, feeds_b)
            label_a, label_b = _label(args.a, engine_a), _label(args.b, engine_b)
    diffs = compare_outputs(out_a, out_b, atol=args.atol, rtol=args.rtol, min_cosine=args.min_cosine)
    passed = all(d.passed for d in diffs)
    if args.json:
        print(
            json.dumps(
                {
                    "a": label_a,
                    "b": label_b,
                    "inputs": source,
                    "shapes": {n: list(v.shape) for n, v in arrays.items()},
                    "atol": args.atol,
                    "rtol": args.rtol,
                    "min_cosine": args.min_cosine,
                    "passed": passed,
                    "outputs": [d.to_json() for d in diffs],
                },
                indent=2,
                allow_nan=False,
            )
        )
    else:
        print(f"A: {label_a}")
        print(f"B: {label_b}")
        print(f"Inputs: {source}: {describe_inputs(arrays)}")
        print(format_diffs(diffs))
    return 0 if passed else 1
