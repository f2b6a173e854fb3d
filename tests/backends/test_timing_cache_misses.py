"""A timing-cache miss says what the cache lacked: the operator, and whether its inputs were never timed or only
some of its candidate kernels were (2026-12-06, H100: every level-5 build of ResNet-50 missed twice, its rebuild
with new weights included, and nothing said which lookups or why)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")


class Choice:
    def __init__(self, name: str) -> None:
        self.name = name

    def hash_key(self) -> str:
        return f"hash-{self.name}"


class FakeCache:
    """What ``PersistentCache.lookup`` reads: the local cache, op -> inputs -> precision -> choice hash -> time."""

    def __init__(self, local: dict[str, Any]) -> None:
        self.local = local

    def get_local_cache(self) -> dict[str, Any]:
        return self.local


def test_a_miss_names_the_candidates_not_timed_before() -> None:
    from streamrt.backends.torch_inductor.cache import _why_missed

    precision = torch.get_float32_matmul_precision()
    cache = FakeCache({"mm": {"in-A": {precision: {"hash-triton_1": 0.1, "hash-aten": 0.2}}}})
    why = _why_missed(cache, [Choice("aten"), Choice("triton_1"), Choice("triton_2")], "mm", "in-A", None)
    assert why.startswith("mm: 1 of 3 candidate kernels not timed before (e.g. triton_2; 2 timed"), why
    never = _why_missed(cache, [Choice("aten")], "mm", "in-B", None)
    assert never.startswith("mm: these inputs never timed (1 other input layouts of mm in the cache"), never
    assert _why_missed(object(), [Choice("aten")], "addmm", "x").startswith("addmm: not diagnosed (AttributeError")


def test_count_autotuning_records_why_a_lookup_benchmarked(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo.utils import counters
    from torch._inductor import codecache

    from streamrt.backends.torch_inductor.cache import TimingCacheStats, count_autotuning

    def lookup(self: Any, choices: Any, op: str, inputs: str, benchmark: Any, hint_override: Any = None) -> Any:
        if inputs == "new":  # benchmarks, as Inductor's does on a miss
            counters["inductor"]["select_algorithm_autotune"] += 1
        return {c: 1.0 for c in choices}

    monkeypatch.setattr(codecache.PersistentCache, "lookup", lookup)
    stats = TimingCacheStats("t")
    with count_autotuning(stats):
        patched: Any = codecache.PersistentCache.lookup  # the wrapper, called as Inductor calls it
        patched(FakeCache({}), [Choice("aten")], "mm", "old", None)
        patched(FakeCache({}), [Choice("aten")], "addmm", "new", None)
    assert (stats.hits, stats.misses) == (1, 1)
    assert len(stats.missed) == 1 and stats.missed[0].startswith("addmm: these inputs never timed"), stats.missed
