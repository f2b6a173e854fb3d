"""A Triton template candidate timed under level 5's first stage (no coordinate descent) is found by the rebuild's
full recipe (coordinate descent on), through Inductor's real timing cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamrt.backends.torch_inductor.cache import TimingCacheStats, count_autotuning
from streamrt.backends.torch_inductor.timing_aliases import ALIAS_PREFIX, alias_of

codecache = pytest.importorskip("torch._inductor.codecache")

META = ("inductor_meta={'kernel_name': 'Placeholder.DESCRIPTIVE_NAME', 'backend_hash': 'B010', "
        "'are_deterministic_algorithms_enabled': False%s, 'grid_type': 'FixedGrid'}\n")
COORDINATE_DESCENT = (", 'coordinate_descent_tuning': True, 'coordinate_descent_search_radius': 1, "
                      "'coordinate_descent_check_all_directions': False")
OP, INPUTS = "mm", "[('cuda', 'torch.float16', 100352, 64, 64, 1, 0)]"


class Bench:
    def __init__(self, path: Path) -> None:
        self.module_path = str(path)


class Choice:
    """What ``PersistentCache.lookup`` and the aliases read of a candidate: its key, name and generated source."""

    def __init__(self, name: str, key: str, source: Path | None = None) -> None:
        self.name, self.key = name, key
        if source is not None:
            self.bmreq = Bench(source)

    def hash_key(self) -> str:
        return self.key


def _template(tmp_path: Path, name: str, block: int, coordinate_descent: bool) -> Path:
    path = tmp_path / f"{name}.py"
    meta = META % (COORDINATE_DESCENT if coordinate_descent else "")
    path.write_text(f"@triton_heuristics.template(\n{meta}BLOCK_M = {block}\n")
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    from torch._inductor import config

    codecache.CacheBase.get_local_cache_path.cache_clear()  # Inductor keeps the path per process
    with config.patch(autotune_local_cache=True):
        yield codecache.PersistentCache()
    codecache.CacheBase.get_local_cache_path.cache_clear()


def _lookup(cache: Any, stats: TimingCacheStats, choices: list[Choice], timed: list[str]) -> dict[Any, float]:
    from torch._dynamo.utils import counters

    def benchmark(to_time: list[Choice]) -> dict[Choice, float]:
        counters["inductor"]["select_algorithm_autotune"] += 1  # as Inductor's benchmark does
        timed.extend(c.name for c in to_time)
        return {c: 1.0 + i for i, c in enumerate(to_time)}

    with count_autotuning(stats):
        return cache.lookup(choices, OP, INPUTS, benchmark)


def test_the_rebuilds_candidates_are_found_under_the_first_stages_timings(cache: Any, tmp_path: Path) -> None:
    first = [Choice("mm", "aten-mm"), Choice("triton_mm_0", "first-0", _template(tmp_path, "a", 64, False)),
             Choice("triton_mm_1", "first-1", _template(tmp_path, "b", 128, False))]
    stats, timed = TimingCacheStats("t"), []
    _lookup(cache, stats, first, timed)
    assert (stats.hits, stats.misses) == (0, 1) and len(timed) == 3

    # a new process, the full recipe: the same kernels, coordinate descent in their sources, so other keys
    rebuild = [Choice("mm", "aten-mm"), Choice("triton_mm_0", "full-0", _template(tmp_path, "c", 64, True)),
               Choice("triton_mm_1", "full-1", _template(tmp_path, "d", 128, True))]
    assert alias_of(rebuild[1]) == alias_of(first[1]) != alias_of(first[2])
    stats, timed = TimingCacheStats("t"), []
    found = _lookup(cache, stats, rebuild, timed)
    assert timed == [] and (stats.hits, stats.misses) == (1, 0)
    assert {c.name: t for c, t in found.items()} == {"mm": 1.0, "triton_mm_0": 2.0, "triton_mm_1": 3.0}


def test_a_candidate_without_a_timed_alias_makes_the_lookup_time_them_all(cache: Any, tmp_path: Path) -> None:
    first = [Choice("mm", "aten-mm"), Choice("triton_mm_0", "first-0", _template(tmp_path, "a", 64, False))]
    _lookup(cache, TimingCacheStats("t"), first, [])
    other = [Choice("mm", "aten-mm"), Choice("triton_mm_0", "full-0", _template(tmp_path, "c", 64, True)),
             Choice("triton_mm_1", "full-1", _template(tmp_path, "d", 32, True))]  # a kernel never timed
    stats, timed = TimingCacheStats("t"), []
    _lookup(cache, stats, other, timed)
    assert (stats.hits, stats.misses) == (0, 1) and timed == ["mm", "triton_mm_0", "triton_mm_1"]
    whole = cache.get_local_cache()[OP][INPUTS]
    (entry,) = whole.values()
    assert "full-0" in entry and "full-1" in entry
    assert sum(key.startswith(ALIAS_PREFIX) for key in entry) == 2  # 64 (both recipes share it) and 32


def test_an_aten_candidate_or_a_missing_source_has_no_alias(tmp_path: Path) -> None:
    assert alias_of(Choice("mm", "aten-mm")) is None
    assert alias_of(Choice("triton_mm_0", "k", tmp_path / "gone.py")) is None
