"""Hybrid decode capacity measured with both sides decoding at once (``measure_hybrid_capacity``), on the CPU:
the NVDEC side is the decoder processes' CPU stand-in. Both sides deliver in one window; a side whose decoder
fails fails the measurement instead of under-counting it; bad arguments are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("av")

from streamrt.errors import ConfigError
from streamrt.video.hybrid_capacity import _drain_together, measure_hybrid_capacity
from streamrt.video.live_group import ReadyPictures


def test_both_sides_decode_at_once_and_each_is_counted(clips: list[Path]) -> None:
    got = measure_hybrid_capacity(clips[0], decode_processes=1, cpu_processes=1, nvdec_sessions=2, seconds=1.0,
                                  warmup_s=0.5, process_kind="cpu", upload=False)
    assert got["nvdec"] > 0 and got["cpu"] > 0, got
    assert (got["nvdec_sessions"], got["cpu_decoders"], got["seconds"]) == (2, 1, 1.0)


class _Failing:
    def take_ready(self, indices: list[int]) -> ReadyPictures:
        return ReadyPictures(failed={indices[0]: "decoding x.mp4 failed: corrupt slice"})


class _Steady:
    def __init__(self) -> None:
        self.calls = 0

    def take_ready(self, indices: list[int]) -> Any:
        self.calls += 1
        return ReadyPictures(taken=[(i, object(), self.calls) for i in indices])


def test_a_failed_stream_fails_the_measurement() -> None:
    with pytest.raises(RuntimeError, match=r"cpu decoding failed: decoding x\.mp4 failed: corrupt slice"):
        _drain_together({"nvdec": (_Steady(), 2), "cpu": (_Failing(), 1)}, seconds=0.2, warmup_s=0.0)


def test_pictures_of_the_warm_up_are_not_counted() -> None:
    steady = _Steady()
    counts = _drain_together({"nvdec": (steady, 3)}, seconds=0.1, warmup_s=0.1)
    assert 0 < counts["nvdec"] < 3 * steady.calls  # every call delivered 3; those before the window do not count


@pytest.mark.parametrize("kwargs", [{"decode_processes": 0}, {"nvdec_sessions": 0}, {"seconds": 0.0}])
def test_bad_arguments_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="measuring hybrid capacity needs"):
        measure_hybrid_capacity("clip.mp4", **kwargs)


def test_a_hybrid_in_decoder_processes_without_capacities_measures_both_sides_at_once(
        clips: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrt.video import hybrid

    calls: list[dict[str, Any]] = []

    def spy(path: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(kwargs)
        return measure_hybrid_capacity(path, **{**kwargs, "seconds": 0.5, "warmup_s": 0.2})

    monkeypatch.setattr(hybrid, "measure_hybrid_capacity", spy)
    monkeypatch.setattr(hybrid, "measure_capacity", lambda *a, **k: pytest.fail("measured one side at a time"))
    with hybrid.HybridDecode([clips[0]] * 3, decode_processes=1, cpu_processes=1, process_kind="cpu",
                             upload=False, interval_s=0) as decode:
        capacity = dict(decode.policy.capacity)
    assert calls == [{"decode_processes": 1, "cpu_processes": 1, "process_kind": "cpu", "upload": False}]
    assert capacity["nvdec"] > 0 and capacity["cpu"] > 0, capacity
