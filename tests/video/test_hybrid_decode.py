"""Hybrid decode end to end on the CPU, with CPU decoders only (NVDEC pools are exercised on the GPU).

Streams decoded by the hybrid sources go through the NV12 stages of the detection workload (fake
CUDA streams on CPU tensors) and give the detections of plain PyAV NV12 sources; the plan lands
in the run report.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("av")
torch = pytest.importorskip("torch")

from streamrt.pipeline.config import PipelineConfig  # noqa: E402
from streamrt.video import DetectConfig, Detections, Frame, SyntheticClip, run_detection  # noqa: E402
from streamrt.video.clips import encode_clip  # noqa: E402
from streamrt.video.decode_av import AvSource  # noqa: E402
from streamrt.video.hybrid import HybridDecode  # noqa: E402
from streamrt.video.hybrid_capacity import measure_cpu_decode  # noqa: E402
from video.detection_helpers import FakeCudaDevice, ImportedEngine  # noqa: E402


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("hybrid")
    seed = int(np.random.default_rng().integers(1000))
    return [encode_clip(SyntheticClip(width=320, height=180, frames=8, seed=seed + i), folder / f"{i}.mp4", crf=18)
            for i in range(3)]


def _detect(model: Any, sources: list[Any]) -> tuple[Any, list[Detections]]:
    out: list[Detections] = []

    def keep(frame: Frame, det: Detections) -> None:
        out.append(det)

    cfg = DetectConfig(pipeline=PipelineConfig(trace=False), use_triton=False)
    report = run_detection(model, sources, cfg, on_result=keep, device=FakeCudaDevice())
    return report, sorted(out, key=lambda d: (d.source, d.index))


def test_an_in_process_stream_removed_closes_its_decoder_and_reads_as_ended(paths: list[Path]) -> None:
    with HybridDecode(paths, capacity={"cpu": 500.0}, interval_s=0) as hybrid:
        first = hybrid.sources()[0]
        closed: list[bool] = []
        real_close = first._impl.close
        first._impl.close = lambda: (closed.append(True), real_close())[1]
        hybrid.remove(0)
        assert closed == [True] and first.read() is None and hybrid.summary()["assignment"]["cpu"] == 2
        assert hybrid.sources()[1].read() is not None
    assert closed == [True]  # not closed a second time with the hybrid


def test_cpu_only_hybrid_gives_the_plain_decoder_detections(detector: Any, paths: list[Path]) -> None:
    model = dataclasses.replace(detector, engine=ImportedEngine("cpu"), device="cuda", backend="torch", max_batch=4)
    with HybridDecode(paths, capacity={"cpu": 500.0}, interval_s=0) as hybrid:
        assert hybrid.assignment == ["cpu"] * 3
        report, got = _detect(model, hybrid.sources())
        report.decode = hybrid.summary()
    _, want = _detect(model, [AvSource(p, output="nv12") for p in paths])
    assert len(got) == len(want) == 24
    assert all(a.same_as(b, atol=1e-4) for a, b in zip(got, want, strict=True))
    assert report.decode["pools"]["cpu"]["streams"] == 3 and report.decode["fits"]
    assert report.decode["pools"]["nvdec"]["capacity_fps"] == 0
    assert [row["decoder"] for row in report.per_source] == ["cpu"] * 3
    assert "decode: cpu 3 streams" in report.format_text()


def test_cpu_capacity_over_demand_is_reported(detector: Any, paths: list[Path]) -> None:
    rate = measure_cpu_decode(paths[0], seconds=0.5)
    assert rate > 30  # 320x180 H.264 on one thread
    with HybridDecode(paths, capacity={"cpu": 40.0}, interval_s=0) as hybrid:  # room for one 30 FPS stream
        summary = hybrid.summary()
    assert not summary["fits"] and summary["binding"] == "cpu"
    assert summary["pools"]["cpu"]["utilisation"] == pytest.approx(90 / 40, rel=1e-3)


def test_cpu_capacity_is_measured_with_every_decoder_running_at_once(paths: list[Path]) -> None:
    """Two decoder processes decoding at the same time on this machine's cores: a positive total, and not more
    than two decoders alone could give (on 2 cores shared with this process it is usually less)."""
    from streamrt.video.hybrid_capacity import measure_cpu_decode_together

    alone = measure_cpu_decode(paths[0], seconds=0.5)
    together = measure_cpu_decode_together(paths[0], 2, seconds=0.5)
    assert 30 < together < 2 * alone * 1.5, (alone, together)  # 1.5: a busy moment of the lone measurement
    assert measure_cpu_decode_together(paths[0], 1, seconds=0.3) > 30  # one: in this process, no spawn


def test_streams_in_decoder_processes_give_the_plain_decoder_detections(detector: Any, paths: list[Path]) -> None:
    """``decode_processes``: the NVDEC side in worker processes (here their CPU stand-in, host shared-memory
    slots), pictures through the same NV12 stages, detections those of plain PyAV NV12 sources."""
    model = dataclasses.replace(detector, engine=ImportedEngine("cpu"), device="cuda", backend="torch", max_batch=4)
    with HybridDecode(paths, capacity={"nvdec": 500.0, "cpu": 0.0}, interval_s=0, decode_processes=2,
                      process_kind="cpu") as hybrid:
        assert hybrid.assignment == ["nvdec"] * 3
        pids = hybrid._nvdec.pids
        _, got = _detect(model, hybrid.sources())
    _, want = _detect(model, [AvSource(p, output="nv12") for p in paths])
    assert len(got) == len(want) == 24
    assert all(a.same_as(b, atol=1e-4) for a, b in zip(got, want, strict=True))
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
