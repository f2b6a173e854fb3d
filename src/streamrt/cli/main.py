"""``streamrt`` command line: one module per subcommand, thin over the Python API.

Every subcommand module exposes ``register(subparsers)`` (adds its parser with a one-line help
and ``func=run``). The global flags (``-v``) are accepted before and after the subcommand.
Errors derived from :class:`StreamRTError`, and files that cannot be written or read, become one
line on stderr and exit status 2; ``--verbose`` shows the traceback. A closed stdout
(``streamrt inspect x | head``) ends the command quietly, as it does other Unix tools.
The flags shared by several subcommands are listed in docs/cli.md.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from streamrt._version import __version__
from streamrt.errors import PERMISSION_ERRNOS, READ_ONLY_ERRNOS, StreamRTError, describe_os_error

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
    _add_global_flags(parser, default=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"streamrt.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"streamrt.cli.{name}":
                continue  # subcommand not part of this build
            raise
        module.register(sub)
    for subparser in sub.choices.values():
        # After the subcommand too; SUPPRESS keeps a flag given before it from being reset.
        _add_global_flags(subparser, default=argparse.SUPPRESS)
    return parser


def _add_global_flags(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", default=default,
                        help="debug logging and tracebacks on errors")


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush is silent."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _flag_for(parser: argparse.ArgumentParser, args: argparse.Namespace, filename: object) -> str | None:
    """The flag (``--export-times``, ``-o/--output``) whose value is ``filename`` or a folder above it."""
    if not isinstance(filename, (str, bytes, os.PathLike)):
        return None
    target = os.path.abspath(os.fsdecode(filename))
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    command = subparsers[0].choices.get(getattr(args, "command", None) or "") if subparsers else None
    for action in command._actions if command is not None else ():
        value = getattr(args, action.dest, None)
        if not action.option_strings or not isinstance(value, (str, os.PathLike)):
            continue
        given = os.path.abspath(os.fspath(value))
        if target == given or target.startswith(given.rstrip(os.sep) + os.sep):
            shorts = [o for o in action.option_strings if not o.startswith("--")][:1]
            longs = [o for o in action.option_strings if o.startswith("--")][:1]
            return "/".join(shorts + longs)
    return None


def _os_error(exc: OSError, flag: str | None = None) -> str:
    """``out/x.plan: read-only file system (hint: ...)``; the hint names ``flag``, the one given."""
    line = describe_os_error(exc)
    if exc.errno == errno.EISDIR:
        return line + f" (hint: give a file path, e.g. {flag or '-o'} {exc.filename}/NAME)"
    if exc.errno in READ_ONLY_ERRNOS:
        fix = "choose a path on a writable file system"
    elif exc.errno in PERMISSION_ERRNOS:
        fix = "choose a path you can write to"
    else:
        return line
    return line + f" (hint: {fix}" + (f" with {flag})" if flag else ")")


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
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's final flush
        return status
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
    except BrokenPipeError:
        _quiet_stdout()
        return 141  # 128 + SIGPIPE, what a shell reports for `yes | head`
    except OSError as exc:
        if args.verbose:
            log.exception("streamrt %s failed", args.command)
        flag = _flag_for(parser, args, exc.filename)
        print(f"streamrt {args.command}: error: {_os_error(exc, flag)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
