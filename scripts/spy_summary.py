"""Summarise py-spy's folded stacks (``py-spy record --threads --format raw``) per thread.

With ``--subprocesses`` each thread is named by its process too (``pid N (command)``), so a build's compile child
shows apart from the process that started it.

For each thread, the share of the samples and the functions it was in most: as the innermost frame (where its
time went) and anywhere on the stack (what it was doing). Waits are named as such: a thread whose innermost frame
is a wait (``wait``, ``sleep``, ``select``, ``poll``, ``recv``, ``acquire``, ``get``) was waiting for something,
not working; ``--skip-waits`` leaves those samples out of the tables (a ``--gil`` profile has none: it samples
the thread holding the GIL only).

Usage::

    python scripts/spy_summary.py out/detectcli/py-spy-threads.txt --top 12 --under _live
    python scripts/spy_summary.py out/detectcli/py-spy-gil.txt --threads MainThread,live-group
"""

from __future__ import annotations

import argparse
import gzip
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

WAITS = ("wait", "sleep", "select", "poll", "recv", "acquire", "get", "_recv_bytes", "_poll", "join", "synchronize")
_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$", re.S)
_THREAD = re.compile(r"^thread \((?P<id>\d+)\)(?::\s*(?P<name>.*))?$")
_PROCESS = re.compile(r'process (?P<pid>\d+):"(?P<command>.*?)";(?=process \d+:|thread \()', re.S)
"""``py-spy record --subprocesses`` puts each sample's chain of processes first (the profiled one, its child, the
child's child...), each with its command line, which may span lines (``python -c "..."``): a sample's threads are
named by the innermost process, ``pid N (command)``."""
_STARTS = ("process ", "thread (")


@dataclass
class Thread:
    name: str
    samples: int = 0
    waiting: int = 0
    innermost: Counter[str] = field(default_factory=Counter)
    anywhere: Counter[str] = field(default_factory=Counter)


def _function(frame: str) -> str:
    """``name (file)`` -> ``name``."""
    return frame.split(" (", 1)[0].strip()


def _command(command: str, width: int = 70) -> str:
    """A process's command line, shortened to what tells processes apart (its script or module and argument)."""
    words = [w for w in command.split() if not w.startswith("-")]
    useful = [w.rsplit("/", 1)[-1] for w in words[1:3]] or words[:1]
    return " ".join(useful)[:width]


def is_wait(frame: str) -> bool:
    name = _function(frame).rsplit(".", 1)[-1]
    return name in WAITS


def _records(text: str) -> list[str]:
    """One sample per item: a line starting a stack (``process``/``thread``), with the lines after it while it has no
    count yet (a command line over several lines); other lines are dropped."""
    records: list[str] = []
    open_record = False
    for line in text.splitlines():
        if line.startswith(_STARTS):
            records.append(line)
        elif open_record:
            records[-1] += "\n" + line
        else:
            continue
        open_record = _LINE.match(records[-1].strip()) is None
    return records


def read(path: Path, skip_waits: bool = False, under: str = "") -> dict[str, Thread]:
    """Threads by name (``id`` where py-spy gave none) from a folded-stack file; with ``under``, only the samples
    with a frame containing it (``_live``: the detector's run loop, not its start)."""
    threads: dict[str, Thread] = {}
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for raw in _records(text):
        match = _LINE.match(raw.strip())
        if match is None:
            continue
        stack = match["stack"]
        processes = list(_PROCESS.finditer(stack))
        process = processes[-1] if processes else None
        if process is not None:
            stack = stack[process.end():]
        frames = stack.split(";")
        head = _THREAD.match(frames[0]) if frames else None
        if head is None:
            continue
        name = head["name"] or f"thread {head['id']}"
        if process is not None:
            name = f"pid {process['pid']} ({_command(process['command'])}) {name}"
        count = int(match["count"])
        body = frames[1:]
        if under and not any(under in frame for frame in body):
            continue
        thread = threads.setdefault(name, Thread(name))
        thread.samples += count
        if body and is_wait(body[-1]):
            thread.waiting += count
            if skip_waits:
                continue
        if body:
            thread.innermost[body[-1]] += count
        for frame in set(body):
            thread.anywhere[frame] += count
    return threads


def summarise(threads: dict[str, Thread], top: int, only: list[str] | None = None) -> str:
    total = sum(t.samples for t in threads.values()) or 1
    lines = []
    for thread in sorted(threads.values(), key=lambda t: -t.samples):
        if only and not any(o in thread.name for o in only):
            continue
        lines += ["", f"## {thread.name}: {thread.samples} samples ({100 * thread.samples / total:.1f}% of all), "
                      f"{100 * thread.waiting / max(thread.samples, 1):.0f}% in a wait", "",
                  "| innermost frame | samples | share | | anywhere on the stack | samples | share |",
                  "|---|---:|---:|---|---|---:|---:|"]
        inner, anywhere = thread.innermost.most_common(top), thread.anywhere.most_common(top)
        for k in range(max(len(inner), len(anywhere))):
            a = inner[k] if k < len(inner) else ("", 0)
            b = anywhere[k] if k < len(anywhere) else ("", 0)
            lines.append(f"| {a[0]} | {a[1] or ''} | {_share(a[1], thread.samples)} | | {b[0]} | {b[1] or ''} "
                         f"| {_share(b[1], thread.samples)} |")
    return "\n".join(lines)


def _share(count: int, samples: int) -> str:
    return f"{100 * count / samples:.0f}%" if count and samples else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path, help="py-spy record --format raw output")
    parser.add_argument("--top", type=int, default=12, help="functions listed per thread")
    parser.add_argument("--threads", default="", help="comma-separated parts of thread names to show (default all)")
    parser.add_argument("--skip-waits", action="store_true", help="leave samples whose innermost frame is a wait out")
    parser.add_argument("--under", default="", metavar="TEXT",
                        help="only samples with a frame containing TEXT (e.g. _live: the detector's run loop)")
    args = parser.parse_args(argv)
    if not args.profile.is_file():
        parser.error(f"no such file: {args.profile}")
    threads = read(args.profile, args.skip_waits, args.under)
    if not threads:
        parser.error(f"{args.profile}: no sample has a frame containing {args.under!r}" if args.under else
                     f"{args.profile}: no folded stacks of py-spy record --threads --format raw")
    only = [t.strip() for t in args.threads.split(",") if t.strip()] or None
    print(f"# {args.profile}: {sum(t.samples for t in threads.values())} samples over {len(threads)} threads")
    print(summarise(threads, args.top, only))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
