"""The pipeline on a real GPU (marker ``gpu``): bit-identical results, no missing waits, no syncs.

Every run uses fresh random frames (the seed is in the failure message) and poisoned output
buffers, and is compared bit for bit with the synchronous baseline on the same frames.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import secrets
import time
from collections import defaultdict

import pytest

from streamrt.errors import StageTimeoutError
from streamrt.pipeline import Pipeline, PipelineConfig, Slot, Stage

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

torch = pytest.importorskip("torch")

from streamrt.testing.workloads import FrameSpec, FrameWorkload, TorchModuleEngine, make_frames, tiny_cnn  # noqa: E402

SPEC = FrameSpec()  # 1080p frames, 640x640 model input, 1000 classes
N_FRAMES = 24


@pytest.fixture(scope="module")
def engine() -> TorchModuleEngine:
    return TorchModuleEngine(tiny_cnn(SPEC, seed=0), device="cuda", dtype=torch.float16)


@pytest.fixture(scope="module")
def frames_and_baseline(engine):
    seed = secrets.randbits(31)
    frames = make_frames(N_FRAMES, SPEC, seed=seed)
    baseline = run(engine, PipelineConfig(topology="sync", device="cuda"), frames)
    return seed, frames, baseline


def run(engine, config: PipelineConfig, values, *, wrap=None, warmup: int = 0):
    workload = FrameWorkload(engine, SPEC, poison=True)
    stages = workload.stages() if wrap is None else wrap(workload.stages())
    with Pipeline(stages, config, setup_lane=workload.setup_lane, setup_slot=workload.setup_slot,
                  collect=workload.collect) as pipe:
        list(pipe.map(values[:warmup]))
        results = list(pipe.map(values))
        if config.cuda_graphs:
            assert pipe.graphs_captured == 3 * len(pipe.slots), "pre, engine and post must be captured per slot"
    errors = [r.error for r in results if not r.ok]
    assert not errors, errors[:3]
    return [r.value for r in results]


def assert_identical(got, baseline, seed: int) -> None:
    assert len(got) % len(baseline) == 0
    for i, result in enumerate(got):
        expected = baseline[i % len(baseline)]
        assert result.equal(expected), f"item {i} differs from the synchronous baseline (frame seed {seed})"
    assert len({r.classes.tobytes() for r in baseline}) > 1, "frames should give different outputs"


CONFIGS = [
    PipelineConfig(topology="sync", cuda_graphs=True, device="cuda"),
    PipelineConfig(topology="streams", ring_size=4, device="cuda"),
    PipelineConfig(topology="streams", ring_size=2, workers=3, device="cuda"),
    PipelineConfig(topology="single", ring_size=3, workers=2, device="cuda"),
    PipelineConfig(topology="streams", ring_size=3, cuda_graphs=True, device="cuda"),
    PipelineConfig(topology="single", ring_size=2, workers=4, cuda_graphs=True, device="cuda"),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.describe().replace(" ", "-"))
def test_bit_identical_to_the_synchronous_baseline(engine, frames_and_baseline, config) -> None:
    seed, frames, baseline = frames_and_baseline
    assert_identical(run(engine, config, frames * 2), baseline, seed)


def jittered(stages: list[Stage], seed: int, default_stream: int, on_default: list[str]) -> list[Stage]:
    """Random GPU (``torch.cuda._sleep``) or host delays before every stage, and a check that no
    CUDA stage runs on the default stream."""
    out = []
    for index, stage in enumerate(stages):
        rng = random.Random(seed + index)

        def fn(slot: Slot, item: int, stream, _stage=stage, _rng=rng) -> None:
            if stream.is_cuda:
                if torch.cuda.current_stream().cuda_stream == default_stream:
                    on_default.append(_stage.name)
                torch.cuda._sleep(_rng.randrange(0, 400_000))  # up to ~0.2 ms of GPU time
            else:
                time.sleep(_rng.random() * 3e-4)
            _stage.fn(slot, item, stream)

        out.append(dataclasses.replace(stage, fn=fn))
    return out


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_stress_small_ring_random_delays(engine, frames_and_baseline, graphs: bool) -> None:
    seed, frames, baseline = frames_and_baseline
    on_default: list[str] = []
    default = torch.cuda.default_stream().cuda_stream
    config = PipelineConfig(topology="streams", ring_size=2, workers=2, cuda_graphs=graphs, device="cuda")
    got = run(engine, config, frames * 8, wrap=lambda s: jittered(s, seed, default, on_default))
    assert_identical(got, baseline, seed)
    assert on_default == []


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_no_hidden_host_syncs_in_the_steady_state(engine, frames_and_baseline, graphs: bool) -> None:
    seed, frames, baseline = frames_and_baseline
    config = PipelineConfig(topology="streams", ring_size=4, workers=2, cuda_graphs=graphs, device="cuda")
    workload = FrameWorkload(engine, SPEC, poison=True)
    with Pipeline.from_workload(workload, config) as pipe:
        list(pipe.map(frames[:8]))  # warm-up: lazy init, allocator growth, cuDNN heuristics
        torch.cuda.set_sync_debug_mode("error")
        try:
            results = list(pipe.map(frames * 2))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    errors = [r.error for r in results if not r.ok]
    assert not errors, f"a stage synchronised with the host: {errors[0]}"
    assert_identical([r.value for r in results], baseline, seed)


def test_sync_baseline_uses_pageable_buffers_and_pipelines_pinned(engine) -> None:
    for topology, pinned in (("sync", False), ("streams", True)):
        workload = FrameWorkload(engine, SPEC)
        with Pipeline.from_workload(workload, PipelineConfig(topology=topology, device="cuda")) as pipe:
            slot = pipe.slots[0]
            assert slot.pinned is pinned
            assert slot["scores_host"].is_pinned() is pinned and slot["frame"].is_pinned() is pinned


def test_trace_spans_follow_the_event_chain_on_the_gpu(engine, frames_and_baseline) -> None:
    _, frames, _ = frames_and_baseline
    config = PipelineConfig(topology="streams", ring_size=3, workers=2, trace=True, nvtx=True, device="cuda")
    with Pipeline.from_workload(FrameWorkload(engine, SPEC), config) as pipe:
        list(pipe.map(frames[:4]))
        pipe.reset_trace()
        list(pipe.map(frames))
        trace = pipe.trace()
    cuda_tracks = {t for t, kind in trace.tracks.items() if kind == "cuda stream"}
    assert cuda_tracks == {f"lane{w}/{g}" for w in range(2) for g in ("in", "engine", "out")}
    by_item: dict[int, dict] = defaultdict(dict)
    for span in trace.spans:
        if span.track in cuda_tracks:
            by_item[span.item][span.stage] = span
    assert len(by_item) == len(frames)
    for spans in by_item.values():
        chain = [spans[name] for name in ("h2d", "pre", "engine", "post", "d2h")]
        for before, after in itertools.pairwise(chain):
            assert after.start_ms >= before.end_ms - 1e-3, (before, after)
    assert any(s.kind == "enqueue" for s in trace.spans)


def test_close_with_gpu_work_in_flight(engine, frames_and_baseline) -> None:
    _, frames, _ = frames_and_baseline
    pipe = Pipeline.from_workload(FrameWorkload(engine, SPEC), PipelineConfig(ring_size=4, device="cuda"))
    for frame in frames[:4]:
        pipe.submit(frame)
    pipe.close()  # drains
    assert [pipe.get().item for _ in range(4)] == [0, 1, 2, 3]
    pipe = Pipeline.from_workload(FrameWorkload(engine, SPEC), PipelineConfig(ring_size=4, device="cuda"))
    for frame in frames[:4]:
        pipe.submit(frame)
    pipe.close(cancel=True)
    assert pipe.slots == []


def test_a_stuck_gpu_stage_times_out(engine) -> None:
    def stuck(slot: Slot, item: int, stream) -> None:
        torch.cuda._sleep(4_000_000_000)  # ~2 s of GPU time

    config = PipelineConfig(ring_size=2, stage_timeout_s=0.3, close_timeout_s=30, device="cuda")
    pipe = Pipeline([Stage("stuck", stuck)], config)
    pipe.submit(None)
    with pytest.raises(StageTimeoutError, match="stage 'stuck' did not finish item 0"):
        pipe.get()
    pipe.close()  # waits for the GPU, then frees buffers
