"""What differs between near-identical generated sources in an Inductor cache directory.

Why: a level-5 rebuild of the same structure (new weights) misses the timing cache on Triton GEMM templates whose
candidates were all timed before ("20 of 21 candidate kernels not timed before"): a template choice's timing-cache
key is the hash of its generated source, so the two builds generated different sources for the same kernel. This
finds every generated source with ``--marker`` in it (Triton templates by default), pairs each with its most
similar other source, and prints the lines that differ, most frequent first, with one whole diff as an example.

Usage::

    python scripts/inductor_source_diff.py TIMING_CACHE_DIR [--marker TEXT] [--examples 2]
"""

from __future__ import annotations

import argparse
import difflib
from collections import Counter
from pathlib import Path

MARKER = "@triton_heuristics.template"


def sources(folder: Path, marker: str) -> dict[Path, list[str]]:
    """Every ``.py`` under ``folder`` containing ``marker``, as lines."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if marker in text:
            found[path] = text.splitlines()
    return found


def nearest_pairs(found: dict[Path, list[str]]) -> list[tuple[Path, Path, float]]:
    """Per source, its most similar *different* source (ratio < 1), each pair once."""
    paths = list(found)
    pairs: dict[tuple[Path, Path], float] = {}
    for i, a in enumerate(paths):
        best: tuple[float, Path] | None = None
        for b in paths[:i] + paths[i + 1:]:
            if found[a] == found[b]:
                continue
            matcher = difflib.SequenceMatcher(None, found[a], found[b], autojunk=False)
            if matcher.real_quick_ratio() <= (best[0] if best else 0) or matcher.quick_ratio() <= (best[0] if best
                                                                                                 else 0):
                continue
            ratio = matcher.ratio()
            if best is None or ratio > best[0]:
                best = (ratio, b)
        if best is not None:
            key = (a, best[1]) if str(a) < str(best[1]) else (best[1], a)
            pairs[key] = best[0]
    return sorted(((a, b, r) for (a, b), r in pairs.items()), key=lambda p: -p[2])


def changed_lines(a: list[str], b: list[str]) -> list[str]:
    """The lines only one side has, as ``- line`` / ``+ line``."""
    return [line for line in difflib.unified_diff(a, b, lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def report(folder: Path, marker: str = MARKER, examples: int = 1, shown: int = 15) -> str:
    found = sources(folder, marker)
    out = [f"{len(found)} generated sources with {marker!r} under {folder}"]
    pairs = nearest_pairs(found)
    if not pairs:
        return "\n".join([*out, "no two of them differ: nothing to compare"])
    counts: Counter[str] = Counter()
    for a, b, _ in pairs:
        counts.update(set(changed_lines(found[a], found[b])))
    out.append(f"{len(pairs)} nearest pairs that differ (similarity {pairs[-1][2]:.3f}-{pairs[0][2]:.3f}); "
               "the differing lines, most frequent first:")
    out += [f"  {n:4d}x {line[:300]}" for line, n in counts.most_common(shown)]
    for a, b, ratio in pairs[:examples]:
        out.append(f"example ({ratio:.3f}): {a.relative_to(folder)} vs {b.relative_to(folder)}")
        out += ["  " + line[:300] for line in difflib.unified_diff(found[a], found[b], lineterm="", n=1)][:60]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--marker", default=MARKER, help="only sources containing this text")
    p.add_argument("--examples", type=int, default=1, help="whole diffs shown")
    args = p.parse_args()
    print(report(args.folder, args.marker, args.examples))


if __name__ == "__main__":
    main()
