"""Rewrite imports of the engine side's old root modules to their packages (issue 25).

For branches that predate the regrouping: ``streamrt.builder`` -> ``streamrt.building.builder``,
``streamrt.runtime`` -> ``streamrt.running.runtime``, ``streamrt.accuracy`` ->
``streamrt.measure.accuracy``, the profiling room's stats and rounds -> ``streamrt.measure``, and
the rest of :data:`MOVES`. The plan metadata key ``"streamrt.inputs"`` (data, not a module) is
left alone. Prints each file it changed.

Usage (from the repository root, after a merge)::

    python scripts/migrate_engine_imports.py $(git ls-files 'src/*.py' 'tests/*.py' 'benchmarks/*.py' \\
        'scripts/*.py' 'examples/*.py' '*.md')
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

MOVES = {
    "builder": "building.builder",
    "module_builder": "building.module_builder",
    "opening": "building.opening",
    "accuracy_gate": "building.accuracy_gate",
    "speed_check": "building.speed_check",
    "runtime": "running.runtime",
    "inputs": "running.inputs",
    "compare": "running.compare",
    "accuracy": "measure.accuracy",
    "profiling.rounds": "measure.rounds",
    "profiling.stats": "measure.stats",
}
_MODULE = re.compile(r"(?<![\w.])streamrt\.(" + "|".join(re.escape(m) for m in MOVES) + r")(?!\w)")


def rewrite(text: str) -> str:
    """``text`` with every old module path replaced (the quoted ``"streamrt.inputs"`` key kept)."""

    def new_path(match: re.Match[str]) -> str:
        quoted = text[match.start() - 1: match.start()] == '"' and text[match.end(): match.end() + 1] == '"'
        if match.group(1) == "inputs" and quoted:
            return match.group(0)
        return "streamrt." + MOVES[match.group(1)]

    return _MODULE.sub(new_path, text)


def main(paths: list[str]) -> int:
    for name in paths:
        path = Path(name)
        if path.resolve() == Path(__file__).resolve():
            continue  # its own table names the old paths
        text = path.read_text()
        new = rewrite(text)
        if new != text:
            path.write_text(new)
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
