"""Parts of a GPU check that fail on their own: one part's crash is a row in the report, not a lost call.

On 2026-12-01 three of six H200 calls died on bugs in the check scripts themselves (a renamed return
type, a static output shape the server refused, a KeyError in the error handling) and took every
other part's numbers with them. A script built on :class:`Report` writes its markdown after every
part, and :meth:`Report.part` turns an exception into a ``FAILED`` line with the exception's type
and message (the traceback goes to stderr), then lets the script go on with the next part::

    report = Report(out / "check.md", ["# My check", ""])
    with report.part("(a) front end"):
        report.add(measure_front_end())
    with report.part("(b) models"):
        report.add(measure_models())
    return report.exit_status()
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Budget:
    """A call's time budget: ``left`` seconds until ``seconds`` after it was made (parts that would not
    fit in what is left are skipped, so a call ends with its report written)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.perf_counter() + seconds

    @property
    def left(self) -> float:
        return self.end - time.perf_counter()


class Report:
    """Markdown lines written to ``path`` after each change, and the names of the parts that failed."""

    def __init__(self, path: Path, header: list[str]) -> None:
        self.path = path
        self.lines: list[str] = list(header)
        self.failed: list[str] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self.write()

    def write(self) -> None:
        """Write the report as it stands (results so far), so a killed call keeps them."""
        self.path.write_text("\n".join(self.lines) + "\n")

    def add(self, lines: list[str]) -> None:
        """Append ``lines`` and write the file."""
        self.lines += lines
        self.write()

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Run the body; an exception (``SystemExit`` too, which helpers use for "gave up") becomes a line.

        ``KeyboardInterrupt`` still stops the script: a person asked for that.
        """
        try:
            yield
        except (SystemExit, Exception) as exc:
            print(f"--- {name} FAILED:", file=sys.stderr, flush=True)
            traceback.print_exc(file=sys.stderr)
            self.failed.append(name)
            message = " ".join(str(exc).split())[-300:].replace("|", "/")
            self.add([f"**{name}: FAILED** ({type(exc).__name__}: {message})", ""])

    def exit_status(self) -> int:
        """0 when every part ran, 1 when one failed (the report says which)."""
        if self.failed:
            self.add([f"Failed parts: {', '.join(self.failed)}."])
        return 1 if self.failed else 0
