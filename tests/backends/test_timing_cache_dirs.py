"""Two builds in one process with two ``--timing-cache`` directories keep their timings apart (Inductor caches its
timing cache's path per process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrt.backends.torch_inductor.cache import timing_cache

codecache = pytest.importorskip("torch._inductor.codecache")


def _time_one(op: str) -> None:
    class Choice:
        def hash_key(self) -> str:
            return "aten-mm"

    choice = Choice()
    codecache.PersistentCache().lookup([choice], op, "inputs", lambda choices: {c: 1.0 for c in choices})


def test_each_build_writes_into_its_own_timing_cache(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    with timing_cache(first, {"device": "cpu"}):
        _time_one("first-op")
    with timing_cache(second, {"device": "cpu"}):
        _time_one("second-op")
    first_text = "".join(p.read_text() for p in (first / "cache").iterdir())
    second_text = "".join(p.read_text() for p in (second / "cache").iterdir())
    assert "first-op" in first_text and "second-op" not in first_text
    assert "second-op" in second_text and "first-op" not in second_text
