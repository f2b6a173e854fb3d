"""Inductor's caches during a build: where ``TORCHINDUCTOR_CACHE_DIR`` points, and the timing cache.

Without ``--timing-cache`` a build uses ``<cache_dir>/inductor`` (a ``TORCHINDUCTOR_CACHE_DIR``
the user set wins). ``--timing-cache DIR`` makes DIR Inductor's cache directory for the build,
like trtexec's ``--timingCacheFile``: it keeps the GEMM/convolution autotuning timings (Inductor's
``autotune_local_cache``, ``DIR/cache/<system hash>``), Triton kernels' tuned configs
(coordinate descent, ``*.best_config``) and compiled kernels, so a rebuild at level 4 or 5 reuses
what was timed. AOTInductor builds do not use the FX graph cache (its counters stay at zero).

DIR records what it was timed on (``streamrt-timing-cache.json``: device, torch, triton and
CUDA versions). A DIR from another GPU model or another version is ignored with one warning:
the build then times into a fresh private directory and leaves DIR as it was.

DIR also keeps the compiled packages (:mod:`.package_cache`), since timings alone still leave a
rebuild re-running the whole AOTInductor compile.

Hits and misses are counted per autotuning lookup (one per GEMM or convolution with several
candidate kernels): a miss is a lookup that had to benchmark the candidates. A Triton template candidate timed
under another recipe (level 5's first stage, without coordinate descent) is found through its alias
(:mod:`.timing_aliases`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrt.backends.torch_inductor.timing_aliases import fill_from_aliases, record_aliases

__all__ = ["IDENTITY_FILE", "TimingCacheStats", "count_autotuning", "inductor_cache", "settle_triton_ptxas",
           "timing_cache"]

log = logging.getLogger(__name__)

IDENTITY_FILE = "streamrt-timing-cache.json"


@dataclass
class TimingCacheStats:
    """What one build found in the timing cache."""

    path: str
    hits: int = 0
    misses: int = 0
    ignored: str = ""  # why the given cache was not used (another GPU or version)
    missed: list[str] = field(default_factory=list)
    """Per miss, what the timing cache lacked (:func:`_why_missed`): which operator, and whether its inputs were never
    timed or only some of its candidate kernels were (a candidate whose identity changes between builds)."""
    packages: list[str] = field(default_factory=list)
    """Per package of the plan, with an explicit timing cache: "compiled", "reused", "reused (level-3 fallback)"..."""

    @property
    def package(self) -> str:
        """``reused`` when every package came from the package cache (with the kind of fallback it reused, when
        every one reused the same kind), ``compiled`` when none did; "" without one."""
        if not self.packages:
            return ""
        reused = [p for p in self.packages if p.startswith("reused")]
        if len(reused) == len(self.packages):
            kinds = sorted(set(reused))  # e.g. "reused (autotuned fallback, coordinate descent off)"
            labels = [k.removeprefix("reused").strip()[1:-1] or "as asked" for k in kinds]
            return kinds[0] if len(kinds) == 1 else f"reused (mixed: {'; '.join(labels)})"
        return "compiled" if not reused else f"reused {len(reused)} of {len(self.packages)}"

    def to_dict(self) -> dict[str, Any]:
        record = {"path": self.path, "hits": self.hits, "misses": self.misses, "ignored": self.ignored}
        return {**record, "package": self.package, "packages": list(self.packages)} if self.packages else record

    def line(self) -> str:
        package = f"; package {self.package}" if self.packages else ""
        if self.ignored:
            return f"timing cache {self.path} ignored ({self.ignored}); {self.misses} autotuning lookups timed"
        return (f"timing cache {self.path}: {self.hits} hits, {self.misses} misses (GEMM/convolution autotuning)"
                f"{package}")


def _forget_timing_cache_path() -> None:
    """Inductor keeps its timing cache's file path per process (``CacheBase.get_local_cache_path`` is cached): without
    this a second build in the process with another cache directory read and wrote the first one's timings."""
    try:
        from torch._inductor.codecache import CacheBase

        CacheBase.get_local_cache_path.cache_clear()
    except Exception as exc:  # torch's internals moved
        log.debug("timing cache path not cleared: %s: %s", type(exc).__name__, exc)


@contextlib.contextmanager
def _cache_dir(folder: Path) -> Iterator[None]:
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    _forget_timing_cache_path()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
        _forget_timing_cache_path()


@contextlib.contextmanager
def inductor_cache(cache_dir: Path) -> Iterator[None]:
    """Inductor's compile cache under ``cache_dir/inductor`` for the duration of a build.

    A ``TORCHINDUCTOR_CACHE_DIR`` the user set wins; otherwise the variable is set and restored.
    """
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    with _cache_dir(cache_dir / "inductor"):
        yield


def settle_triton_ptxas() -> None:
    """Point Triton at the ptxas Inductor's compile workers use, before this process hashes Triton's backend.

    A Triton GEMM template candidate's timing-cache key is the hash of its generated source, and the source carries
    ``backend_hash`` (Triton's version and its ptxas's ``--version``, read once per process). Inductor points
    ``TRITON_PTXAS_PATH`` at torch's own ptxas (where the wheel has one) when its compile workers start, so a process
    that hashed before that and one that hashed after wrote different sources for the same kernel: on the H100 of
    2026-12-07 the timing cache held the template candidates under two ``backend_hash`` values, and a candidate
    timed under one was not found under the other (the rebuild's "mm: 20 of 21 candidate kernels not timed before"
    had a second cause too: coordinate descent, :mod:`.timing_aliases`). Setting it first makes every compile process
    hash alike (after it, one value). Never raises (torch's internals may move)."""
    try:
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path

        _set_triton_ptxas_path()
    except Exception as exc:
        log.debug("TRITON_PTXAS_PATH not settled: %s: %s", type(exc).__name__, exc)


def _mismatch(recorded: Mapping[str, Any], identity: Mapping[str, Any]) -> str:
    diffs = [f"{k} {recorded.get(k)!r} here {v!r}" for k, v in identity.items() if recorded.get(k) != v]
    return "timed on " + ", ".join(diffs) if diffs else ""


def _why_missed(cache: Any, choices: Any = (), op: str = "?", inputs: str = "", *args: Any, **kwargs: Any) -> str:
    """What ``PersistentCache.lookup(choices, op, inputs, ...)`` will not find in the local timing cache, in words
    (read before the lookup; only used when the lookup then benchmarks). Never raises: a diagnosis, not a step."""
    try:
        import torch

        hint = kwargs.get("hint_override", args[1] if len(args) > 1 else None)
        key = f"{inputs}_{hint}" if hint is not None else inputs
        known = cache.get_local_cache().get(op, {})
        timed = known.get(key, {}).get(torch.get_float32_matmul_precision(), {})
        names = [(c.hash_key(), getattr(c, "name", type(c).__name__)) for c in choices]
        missing = [name for h, name in names if h not in timed]
        if not timed:
            return (f"{op}: these inputs never timed ({len(known)} other input layouts of {op} in the cache; "
                    f"inputs {inputs[:120]})")
        return (f"{op}: {len(missing)} of {len(names)} candidate kernels not timed before (e.g. "
                f"{', '.join(missing[:3])}; {len(timed)} timed for these inputs)")
    except Exception as exc:  # torch's internals moved: say so, never fail the build
        return f"{op}: not diagnosed ({type(exc).__name__}: {exc})"


@contextlib.contextmanager
def count_autotuning(stats: TimingCacheStats,
                     on_miss: Callable[[str], None] | None = None) -> Iterator[TimingCacheStats]:
    """Count autotuning lookups into ``stats``: a lookup that benchmarked is a miss, one that did not a hit.

    Wraps Inductor's ``PersistentCache.lookup`` (the autotuning timing cache) for the block; the
    benchmark counter ``counters["inductor"]["select_algorithm_autotune"]`` tells the two apart.
    ``on_miss`` hears each miss's :func:`_why_missed` as it happens (a compile child prints it at once: a child
    killed at its deadline reports no totals).
    """
    from torch._dynamo.utils import counters
    from torch._inductor import codecache

    original = codecache.PersistentCache.lookup

    def lookup(self: Any, *args: Any, **kwargs: Any) -> Any:
        choices = kwargs.get("choices", args[0] if args else ())
        op = kwargs.get("op", args[1] if len(args) > 1 else "?")
        inputs = kwargs.get("inputs", args[2] if len(args) > 2 else "")
        hint = kwargs.get("hint_override", args[4] if len(args) > 4 else None)
        filled = fill_from_aliases(self, choices, op, inputs, hint)
        if filled:
            log.info("timing cache: %s: %d candidate kernels found under another recipe's key", op, filled)
        before = counters["inductor"]["select_algorithm_autotune"]
        why = _why_missed(self, *args, **kwargs)
        result = original(self, *args, **kwargs)
        if counters["inductor"]["select_algorithm_autotune"] > before:
            record_aliases(self, result, op, inputs, hint)
            stats.misses += 1
            stats.missed.append(why)
            log.info("timing cache miss: %s", why)
            if on_miss is not None:
                on_miss(why)
        elif result:
            stats.hits += 1
        return result

    codecache.PersistentCache.lookup = lookup  # type: ignore[method-assign]
    try:
        yield stats
    finally:
        codecache.PersistentCache.lookup = original  # type: ignore[method-assign]


@contextlib.contextmanager
def timing_cache(folder: Path, identity: Mapping[str, Any]) -> Iterator[TimingCacheStats]:
    """Build with ``folder`` as Inductor's cache directory; yields the stats, filled when the block ends."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        from streamrt.errors import ConfigError

        raise ConfigError(
            f"--timing-cache {folder} is a file; torch_inductor keeps its timing cache in a directory",
            hint=f"pass a directory, e.g. --timing-cache {folder.with_suffix('')}.d",
        )
    stats = TimingCacheStats(str(folder))
    record = folder / IDENTITY_FILE
    recorded = json.loads(record.read_text()) if record.is_file() else None
    stats.ignored = _mismatch(recorded, identity) if recorded is not None else ""
    if stats.ignored:
        log.warning("ignoring timing cache %s: %s; timing afresh", folder, stats.ignored)
        with tempfile.TemporaryDirectory(prefix="streamrt-timing-") as tmp, _cache_dir(Path(tmp)), \
                count_autotuning(stats):
            yield stats
        return
    folder.mkdir(parents=True, exist_ok=True)
    if recorded is None:
        record.write_text(json.dumps(dict(identity), indent=2, sort_keys=True))
    with _cache_dir(folder), count_autotuning(stats):
        yield stats
