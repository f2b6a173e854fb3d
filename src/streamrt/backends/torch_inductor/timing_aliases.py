"""Timing-cache entries that survive a change of recipe: a Triton template candidate timed under one recipe found
under another.

Inductor keys a Triton template candidate's timing by the hash of its generated source, and the source carries the
recipe's ``inductor_meta``. Level 5's first stage autotunes without coordinate descent, so the timing cache holds
its GEMM candidates under sources without ``coordinate_descent_tuning``; a rebuild with new weights compiles the
full recipe (coordinate descent on), whose candidates are the same kernels under other keys, and re-timed them all
(H100, 2026-12-07: ``mm: 20 of 21 candidate kernels not timed before``, 2-4 s). Coordinate descent tunes a kernel's
launch when it runs; the candidate's kernel and the timing that ranks it are the same.

So each timing Inductor writes for such a candidate is also written under an alias (``streamrt-alias:<hash>``, the
source with coordinate descent's flags taken out, in the same entry of Inductor's cache file, where Inductor never
looks), and before a lookup a candidate missing under its own key gets the timing of its alias, when every missing
candidate has one (else the lookup times them all, as Inductor would). Never raises: a diagnosis of keys, not a
step of the build.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["ALIAS_PREFIX", "alias_of", "fill_from_aliases", "record_aliases"]

log = logging.getLogger(__name__)

ALIAS_PREFIX = "streamrt-alias:"
_RECIPE_ONLY = re.compile(r",\s*'coordinate_descent_[a-z_]+':\s*[^,}]+")
"""``inductor_meta`` entries that change a recipe, not the kernel: coordinate descent's switch, radius, directions."""


def alias_of(choice: Any) -> str | None:
    """The alias of a Triton template candidate (its generated source without recipe-only entries, hashed with its
    name's stem, as Inductor's key is); None for a candidate without a generated source file (ATen's)."""
    try:
        path = getattr(getattr(choice, "bmreq", None), "module_path", None)
        if not path or not Path(path).is_file():
            return None
        text = _RECIPE_ONLY.sub("", Path(path).read_text())
        stem = str(getattr(choice, "name", "")).rsplit("_", 1)[0]
        return ALIAS_PREFIX + hashlib.sha256(f"{stem}\n{text}".encode()).hexdigest()[:32]
    except Exception as exc:  # torch's internals moved
        log.debug("no timing alias: %s: %s", type(exc).__name__, exc)
        return None


def _entry(cache: Any, op: str, inputs: str, hint_override: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Inductor's whole local cache and the entry of one lookup (created empty where missing)."""
    import torch

    key = f"{inputs}_{hint_override}" if hint_override is not None else inputs
    whole = cache.get_local_cache()
    entry = whole.setdefault(op, {}).setdefault(key, {}).setdefault(torch.get_float32_matmul_precision(), {})
    return whole, entry


def fill_from_aliases(cache: Any, choices: Iterable[Any], op: str, inputs: str, hint_override: Any = None) -> int:
    """Before ``PersistentCache.lookup``: give each candidate missing under its own key its alias's timing, when every
    missing one has an alias timed; returns how many were filled (0: the lookup goes on as Inductor's)."""
    try:
        whole, entry = _entry(cache, op, inputs, hint_override)
        missing = {key: c for c in choices if (key := c.hash_key()) not in entry}
        if not missing:
            return 0
        found = {key: entry.get(alias_of(c) or "") for key, c in missing.items()}
        if any(timing is None for timing in found.values()):
            return 0
        entry.update(found)
        cache.update_local_cache(whole)
        return len(missing)
    except Exception as exc:
        log.debug("timing aliases not read: %s: %s", type(exc).__name__, exc)
        return 0


def record_aliases(cache: Any, timings: Mapping[Any, float], op: str, inputs: str, hint_override: Any = None) -> None:
    """After a lookup that timed its candidates: write each template candidate's timing under its alias too."""
    try:
        aliases = [(alias_of(c), t) for c, t in timings.items()]
        pairs = {a: t for a, t in aliases if a is not None}
        if not pairs:
            return
        whole, entry = _entry(cache, op, inputs, hint_override)
        entry.update(pairs)
        cache.update_local_cache(whole)
    except Exception as exc:
        log.debug("timing aliases not written: %s: %s", type(exc).__name__, exc)
