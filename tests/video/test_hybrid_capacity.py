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
    from streamrt.video.hybrid_capacity import CPU_DECODER_NICENESS, measure_hybrid_capacity_for_plan
    from streamrt.video.hybrid_policy import DEFAULT_HEADROOM

    calls: list[tuple[list[float], dict[str, Any]]] = []

    def spy(path: Any, demands: list[float], **kwargs: Any) -> dict[str, Any]:
        calls.append((list(demands), kwargs))
        return measure_hybrid_capacity_for_plan(path, demands, **{**kwargs, "seconds": 0.5, "warmup_s": 0.2})

    monkeypatch.setattr(hybrid, "measure_hybrid_capacity_for_plan", spy)
    monkeypatch.setattr(hybrid, "measure_capacity", lambda *a, **k: pytest.fail("measured one side at a time"))
    with hybrid.HybridDecode([clips[0]] * 3, decode_processes=1, cpu_processes=1, process_kind="cpu",
                             upload=False, interval_s=0) as decode:
        capacity = dict(decode.policy.capacity)
        measured = decode.measured
    (demands, kwargs), = calls
    assert len(demands) == 3 and kwargs == {"headroom": DEFAULT_HEADROOM, "decode_processes": 1,
                                            "cpu_processes": 1, "process_kind": "cpu", "upload": False,
                                            "cpu_niceness": CPU_DECODER_NICENESS}
    assert capacity["nvdec"] > 0 and capacity["cpu"] > 0, capacity
    assert measured is not None and measured["nvdec"] == capacity["nvdec"] and "first" in measured


def test_the_plan_s_nvdec_session_count_is_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 free-running sessions over-stated what 139 paced streams got on an H100 (2026-12-06): the capacity is
    measured again with the NVDEC streams the first plan keeps within its share (not the overflow)."""
    from streamrt.video import hybrid_capacity

    calls: list[int] = []

    def fake(path: Any, *, nvdec_sessions: int, **kw: Any) -> dict[str, Any]:
        calls.append(nvdec_sessions)
        return {"nvdec": 1000.0 if nvdec_sessions <= 16 else 800.0, "cpu": 300.0, "nvdec_sessions": nvdec_sessions,
                "cpu_decoders": kw["cpu_processes"], "seconds": 1.0}

    monkeypatch.setattr(hybrid_capacity, "measure_hybrid_capacity", fake)
    got = hybrid_capacity.measure_hybrid_capacity_for_plan("x.mp4", [30.0] * 60, headroom=0.9, cpu_processes=3)
    # 0.9 x 1000 frames/s hold 30 streams of 30 FPS; the other 30 go to the CPU or overflow, not counted
    assert calls == [16, 30] and got["planned_nvdec"] == 30 and got["nvdec_sessions"] == 30
    assert (got["nvdec"], got["first"]["nvdec"]) == (800.0, 1000.0)
    calls.clear()
    few = hybrid_capacity.measure_hybrid_capacity_for_plan("x.mp4", [30.0] * 10, headroom=0.9, cpu_processes=3)
    assert calls == [16] and few["planned_nvdec"] == 10 and few["nvdec"] == 1000.0  # within the first count


def test_the_plan_s_count_on_the_stand_in(clips: list[Path]) -> None:
    from streamrt.video.hybrid_capacity import measure_hybrid_capacity_for_plan

    got = measure_hybrid_capacity_for_plan(clips[0], [1.0, 1.0, 1.0], headroom=0.9, first_sessions=1,
                                           decode_processes=1, cpu_processes=1, seconds=0.5, warmup_s=0.3,
                                           process_kind="cpu", upload=False)
    assert got["first"]["nvdec_sessions"] == 1 and got["planned_nvdec"] == 3 and got["nvdec_sessions"] == 3, got
    assert got["nvdec"] > 0 and got["cpu"] > 0


def test_the_codec_is_read_without_pyav_too(clips: list[Path], monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    """Where PyAV is missing (the H200 image) the codec comes from OpenCV's FourCC: an H.264 file was keyed ``raw``
    in the capacity cache there. Not a video: ``raw`` either way."""
    import sys

    pytest.importorskip("cv2")
    from streamrt.video.capacity import probe_codec

    assert probe_codec(clips[0]) == "h264"
    monkeypatch.setitem(sys.modules, "av", None)  # import av raises ImportError
    assert probe_codec(clips[0]) == "h264"
    text = tmp_path / "notes.txt"
    text.write_text("not a video")
    assert probe_codec(text) == "raw" and probe_codec(tmp_path / "missing.mp4") == "raw"
