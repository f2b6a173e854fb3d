"""``streamrt`` command line: one module per subcommand, thin over the Python API.

Every subcommand module exposes ``register(subparsers)`` (adds its parser with a one-line help
and ``func=run``). Errors derived from :class:`StreamRTError` become one line on stderr and exit
status 2; ``--verbose`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from streamrt import __version__
from streamrt.errors import StreamRTError

__all__ = ["SUBCOMMANDS", "main"]

# Subcommand modules in the order `streamrt --help` lists them.
SUBCOMMANDS = (
    "build",
    "inspect",
    "bench",
    "compare",
    "profile",
    "pipeline_bench",
    "detect",
    "demo",
    "serve",
    "perf",
)

log = logging.getLogger("streamrt")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamrt",
        description="Build fast inference engines and keep the GPU busy while they run.",
    )
    parser.add_argument("--version", action="version", version=f"streamrt {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging and tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"streamrt.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"streamrt.cli.{name}":
                continue  # subcommand not part of this build
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``streamrt`` console script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(message)s" if not args.verbose else "%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:
        # Third-party chatter stays out of the CLI's output unless asked for.
        for noisy in ("onnxruntime", "torch", "matplotlib", "PIL"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except StreamRTError as exc:
        if args.verbose:
            log.exception("streamrt %s failed", args.command)
        print(f"streamrt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError as exc:  # an allocation outside the guarded build/load/inference paths
        if args.verbose:
            log.exception("streamrt %s failed", args.command)
        detail = f": {exc}" if str(exc) else ""
        print(f"streamrt {args.command}: error: out of host memory{detail} (hint: use smaller inputs or "
              "shapes, or a machine with more free memory)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"streamrt {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
