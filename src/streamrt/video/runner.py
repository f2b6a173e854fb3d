"""Run sources through the detection pipeline: free-running or camera-paced, one camera or many.

Free-running, frames are read as fast as the pipeline takes them (a file being processed).
Camera-paced, every source behaves like a live camera at ``fps``: frame ``k`` exists from
``t0 + k / fps`` on, the camera keeps only its newest frame, and when the pipeline is still busy
(``submit`` blocks while the ring is full) the frames produced meanwhile are dropped and counted,
exactly as a capture card with a one-frame buffer would. Latency is measured from the instant a
frame was produced, so a pipeline that keeps up shows it, and one that does not shows drops.

Several sources are read in lock step (one frame of each per tick, as DeepStream's ``nvstreammux``
does) and batched ``batch`` frames per engine call; ``batch`` defaults to the number of sources,
capped by the engine's dynamic batch profile.

Example:
    >>> detector = open_detector(bundled_model())                            # doctest: +SKIP
    >>> report = run_detection(detector, [open_source("synthetic")], DetectConfig())  # doctest: +SKIP
    >>> print(report.format_text())                                           # doctest: +SKIP
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamrt.device.base import Device
from streamrt.errors import ConfigError
from streamrt.ops.letterbox import Normalize
from streamrt.ops.postprocess import PostprocessConfig
from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.pipeline.executor import Pipeline
from streamrt.pipeline.stage import Result
from streamrt.video.admission import Admission
from streamrt.video.live import LiveStream
from streamrt.video.live_group import GroupedStream, LiveGroup, shared_lanes
from streamrt.video.model import DetectorModel
from streamrt.video.report import RunReport, latency_stats
from streamrt.video.sources import FrameSource
from streamrt.video.workload import Detections, DetectionWorkload, Frame

__all__ = ["WINDOWS", "DetectConfig", "run_detection", "window_rates"]

log = logging.getLogger(__name__)

OnResult = Callable[[Frame, Detections], None]
Progress = Callable[[int, int | None], None]


LIVE_READERS = ("auto", "threads", "group")
"""How live streams may be read (:attr:`DetectConfig.live_reader`)."""


@dataclass(frozen=True)
class DetectConfig:
    """How a detection run feeds the pipeline.

    Attributes:
        postprocess: thresholds, ``max_det``.
        normalize: the model's input normalisation (YOLO: RGB / 255).
        pipeline: topology, ring size, workers, CUDA graphs, tracing (its ``device`` is replaced by
            the engine's).
        batch: frames per engine call; 0 means one per source, capped by the engine's batch range.
        paced: camera-paced mode (see the module docstring).
        fps: pacing rate per source; None uses the first source's frame rate.
        max_frames: stop after this many frames per source.
        warmup_frames: frames per source run before measuring (their results are delivered but not
            counted): lazy initialisation, allocator growth and CUDA graph capture stay out of the numbers.
        use_triton: device ops on Triton kernels (None: wherever they can run).
        live: with ``paced``, every source runs as a :class:`~streamrt.video.live.LiveStream` (its own
            thread, paced at ``fps``, a drop-oldest queue of ``queue_depth`` frames) served round-robin:
            under overload every stream drops the same share and latency stays bounded. Without it,
            the lock-step tick of the module docstring.
        queue_depth: frames each live stream holds for the pipeline.
        live_reader: how live streams are read: ``threads`` (a :class:`~streamrt.video.live.LiveStream`
            thread per source), ``group`` (one :class:`~streamrt.video.live_group.LiveGroup` thread for
            streams of one decoder pool), ``auto`` (the group where the sources allow it).
        calls_ahead: live streams: a part-filled engine call starts only when fewer than this many calls
            are in flight (meanwhile more frames come). None: 2 on a CUDA engine, whose calls run the full
            batch however few frames fill it; no wait on a CPU engine, whose calls run only the frames given.
    """

    postprocess: PostprocessConfig = field(default_factory=PostprocessConfig)
    normalize: Normalize = field(default_factory=Normalize)
    pipeline: PipelineConfig = field(default_factory=lambda: PipelineConfig(topology=Topology.STREAMS, trace=True))
    batch: int = 0
    paced: bool = False
    fps: float | None = None
    max_frames: int | None = None
    warmup_frames: int = 0
    use_triton: bool | None = None
    live: bool = False
    queue_depth: int = 2
    live_reader: str = "auto"
    calls_ahead: int | None = None

    def __post_init__(self) -> None:
        if self.live_reader not in LIVE_READERS:
            raise ConfigError(f"live_reader must be one of {', '.join(LIVE_READERS)}, got {self.live_reader!r}")
        if self.calls_ahead is not None and self.calls_ahead < 1:
            raise ConfigError(f"calls_ahead must be >= 1, got {self.calls_ahead}")
        if self.queue_depth < 1:
            raise ConfigError(f"queue_depth must be >= 1, got {self.queue_depth}")
        if self.batch < 0:
            raise ConfigError(f"batch must be >= 0 (0: one frame per source), got {self.batch}")
        if self.fps is not None and self.fps <= 0:
            raise ConfigError(f"fps must be > 0, got {self.fps}")


class _Mux:
    """Reads one frame of every live source per tick and cuts them into engine batches."""

    def __init__(self, sources: Sequence[FrameSource], batch: int, max_frames: int | None) -> None:
        self.sources = list(sources)
        self.batch = batch
        self.max_frames = max_frames
        self.read = [0] * len(sources)
        self.live = [True] * len(sources)

    def tick(self, captured: float | None = None) -> list[list[Frame]] | None:
        frames = []
        for s, source in enumerate(self.sources):
            if not self.live[s] or (self.max_frames is not None and self.read[s] >= self.max_frames):
                continue
            image = source.read()
            if image is None:
                self.live[s] = False
                continue
            stamp = getattr(source, "last_captured", 0.0) or (time.perf_counter() if captured is None else captured)
            frames.append(Frame(s, self.read[s], image, stamp))  # a live camera stamps its own capture instant
            self.read[s] += 1
        if not frames:
            return None
        return [frames[i: i + self.batch] for i in range(0, len(frames), self.batch)]

    def skip(self, count: int) -> int:
        dropped = 0
        for s, source in enumerate(self.sources):
            if self.live[s]:
                n = source.skip(count)
                self.read[s] += n
                dropped += n
        return dropped


@dataclass
class _Tally:
    on_result: OnResult | None
    progress: Progress | None
    total: int | None
    pending: dict[tuple[int, int], Frame] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)
    by_source: dict[int, list[float]] = field(default_factory=dict)
    done_s: list[float] = field(default_factory=list)  # completion time of every measured frame
    frames: int = 0
    detections: int = 0
    calls: int = 0  # engine calls (pipeline items) while measuring: frames / calls is how full the batches were
    measuring: bool = True
    last: float = 0.0

    def handle(self, result: Result) -> None:
        now = time.perf_counter()
        for det in result.unwrap():
            frame = self.pending.pop((det.source, det.index))
            if self.on_result is not None:
                self.on_result(frame, det)
            if self.measuring:
                self.latencies_ms.append((now - frame.captured) * 1e3)
                self.by_source.setdefault(frame.source, []).append(self.latencies_ms[-1])
                self.done_s.append(now)
                self.frames += 1
                self.detections += len(det)
        self.last = now
        if self.progress is not None:
            self.progress(self.frames, self.total)


def _submit(pipe: Pipeline, tally: _Tally, chunk: list[Frame]) -> None:
    for frame in chunk:
        tally.pending[(frame.source, frame.index)] = frame
    tally.calls += tally.measuring
    pipe.submit(chunk)
    for result in pipe.poll():
        tally.handle(result)


def _drain(pipe: Pipeline, tally: _Tally) -> None:
    while pipe.in_flight:
        tally.handle(pipe.get())
    for result in pipe.poll():
        tally.handle(result)


def _free_running(pipe: Pipeline, mux: _Mux, tally: _Tally) -> None:
    while (chunks := mux.tick()) is not None:
        for chunk in chunks:
            _submit(pipe, tally, chunk)


def _camera_paced(pipe: Pipeline, mux: _Mux, tally: _Tally, fps: float) -> int:
    period = 1.0 / fps
    t0 = time.perf_counter()
    tick = 0
    dropped = 0
    while True:
        target = t0 + tick * period
        while (now := time.perf_counter()) < target:
            for result in pipe.poll():
                tally.handle(result)
            time.sleep(min(target - now, 5e-4))
        newest = int((now - t0) / period)
        if newest > tick:  # the cameras moved on while we were busy: only their newest frame is left
            dropped += mux.skip(newest - tick)
            tick = newest
        chunks = mux.tick(captured=t0 + tick * period)
        if chunks is None:
            return dropped
        for chunk in chunks:
            _submit(pipe, tally, chunk)
        tick += 1


def _live_streams(sources: Sequence[FrameSource], config: DetectConfig, fps: float, wake: threading.Condition,
                  first: list[int]) -> Sequence[LiveStream | GroupedStream]:
    """The live streams of a run: one :class:`~streamrt.video.live_group.LiveGroup` thread for streams of one
    decoder pool (``live_reader`` auto or group), else a :class:`~streamrt.video.live.LiveStream` thread each."""
    limits = [None if config.max_frames is None else config.max_frames - first[i] for i in range(len(sources))]
    shared = shared_lanes(sources) if config.live_reader != "threads" else None
    if shared is not None:
        pool, lanes = shared
        return LiveGroup(pool, lanes, [s.info for s in sources], fps=fps, depth=config.queue_depth, wake=wake,
                         first_index=first, max_frames=limits).streams
    if config.live_reader == "group":
        raise ConfigError("live_reader='group' needs every source to be a stream of one decoder pool",
                          hint="open the sources with NvdecPool or ProcessDecodePool, or use live_reader='auto'")
    return [LiveStream(s, fps=fps, depth=config.queue_depth, wake=wake, first_index=first[i], max_frames=limits[i])
            for i, s in enumerate(sources)]


def _live(pipe: Pipeline, streams: Sequence[LiveStream | GroupedStream], tally: _Tally, batch: int, running: list[int],
          waiting: list[int], ahead: int) -> None:
    """Serve live streams round-robin, one frame per stream per turn, up to ``batch`` frames per call.

    A turn starts after the stream served last, so no stream is favoured by its position. The engine
    runs its full batch however few frames fill it, so a part-filled call starts only when fewer than
    ``ahead`` calls are in flight (the GPU would soon run dry); until then the frames taken wait in
    hand while the next turns add to them. When a stream ends, the first ``waiting`` one (admission
    ``queue``) starts in its place.
    """
    wake = streams[0].wake
    for i in running:
        streams[i].start()
    turn = 0
    held: list[Frame] = []
    while running or held:
        took = False
        served = turn - 1
        for k in range(len(running)):
            if len(held) == batch:
                break
            pos = (turn + k) % len(running)
            got = streams[running[pos]].take()
            if got is not None:
                held.append(Frame(running[pos], got.index, got.image, got.captured))
                served, took = pos, True
        turn = served + 1
        for result in pipe.poll():
            tally.handle(result)
        if held and (len(held) == batch or pipe.in_flight < ahead or not running):
            _submit(pipe, tally, held)
            held = []
            continue
        if took:
            continue  # more may have come meanwhile
        ended = [i for i in running if streams[i].done]
        for i in ended:
            running.remove(i)
            if waiting:
                nxt = waiting.pop(0)
                log.info("stream %s ended; starting queued stream %s", streams[i].info.name, streams[nxt].info.name)
                running.append(nxt)
                streams[nxt].start()
        if not ended:
            with wake:
                wake.wait(timeout=0.002)


def run_detection(
    model: DetectorModel,
    sources: Sequence[FrameSource],
    config: DetectConfig = DetectConfig(),
    *,
    on_result: OnResult | None = None,
    progress: Progress | None = None,
    device: Device | None = None,
    admission: Admission | None = None,
) -> RunReport:
    """Run ``sources`` through the detection pipeline and return the run's report.

    Args:
        model: from :func:`~streamrt.video.model.open_detector`.
        sources: one or more sources of the same frame size.
        config: how to feed the pipeline.
        on_result: called with every frame and its detections, in order per source (sinks).
        progress: called with (frames done, frames expected or None) after every result.
        device: the pipeline's device (default: ``get_device(model.device)``).
        admission: which sources run now, wait, or are refused (:mod:`streamrt.video.admission`);
            refused and queued sources need ``config.live`` (queued ones start as running ones end).

    Raises:
        ConfigError: no sources, sources of different sizes, or a batch the engine cannot take.
    """
    if not sources:
        raise ConfigError("a detection run needs at least one source")
    sizes = {(s.info.height, s.info.width) for s in sources}
    if len(sizes) != 1:
        raise ConfigError(f"sources must share one frame size to be batched, got {sorted(sizes)}",
                          hint="run sources of different sizes separately")
    batch = config.batch or min(len(sources), model.max_batch)
    if batch > model.max_batch:
        raise ConfigError(f"batch {batch} exceeds the engine's largest batch {model.max_batch}",
                          hint="rebuild with a larger dynamic batch profile (--max-batch)")
    (frame_hw,) = sizes
    formats = {getattr(s, "frame_format", "bgr") for s in sources}  # NV12 from NVDEC or decoders asked for it
    if len(formats) != 1:
        raise ConfigError(f"sources must deliver one frame format to be batched, got {sorted(formats)}",
                          hint="open every source with the same decoder output (bgr or nv12)")
    workload = DetectionWorkload(model, frame_hw, batch=batch, postprocess=config.postprocess,
                                 normalize=config.normalize, use_triton=config.use_triton,
                                 frame_format=formats.pop())
    pcfg = config.pipeline.replace(device=model.device)
    fps = config.fps or sources[0].info.fps or 30.0
    counts = [s.info.frames for s in sources]
    total = None if None in counts else sum(min(c or 0, config.max_frames or c or 0) for c in counts)
    tally = _Tally(on_result, progress, total)
    mux = _Mux(sources, batch, config.max_frames)
    dropped = 0
    live_stats: dict[int, dict[str, int]] | None = None
    with Pipeline.from_workload(workload, pcfg, device=device) as pipe:
        if config.warmup_frames:
            tally.measuring = False
            warm = _Mux(sources, batch, config.warmup_frames)
            _free_running(pipe, warm, tally)
            _drain(pipe, tally)
            mux.read = list(warm.read)
            mux.live = list(warm.live)
            tally.measuring = True
            pipe.reset_trace()
        started = time.perf_counter()
        if config.paced and config.live:
            running = list(admission.admitted) if admission is not None else list(range(len(sources)))
            waiting = list(admission.queued) if admission is not None else []
            streams = _live_streams(sources, config, fps, threading.Condition(), mux.read)
            try:
                ahead = config.calls_ahead or (2 if workload.cuda else sys.maxsize)
                _live(pipe, streams, tally, batch, running, waiting, ahead)
            finally:
                for stream in streams:
                    stream.stop()  # the caller closes the sources
            live_stats = {i: st.stats() for i, st in enumerate(streams) if st.started}
        elif config.paced:
            if admission is not None and len(admission.admitted) < len(sources):
                raise ConfigError("refusing or queueing streams needs live streams",
                                  hint="DetectConfig(paced=True, live=True), or admission mode off")
            dropped = _camera_paced(pipe, mux, tally, fps)
        else:
            _free_running(pipe, mux, tally)
        _drain(pipe, tally)
        trace = pipe.trace()
    wall = max(tally.last - started, 1e-9)
    per_source = _per_source(sources, tally, wall, live_stats, admission)
    dropped += sum(int(p.get("dropped", 0)) for p in per_source)
    from streamrt.profiling.pipeline_summary import summarize

    summary = summarize(trace)
    h, w = frame_hw
    return RunReport(
        label=pcfg.describe() + (" paced" if config.paced else ""), model=model.source, backend=model.backend,
        device=model.device, sources=len(sources), frame_size=f"{w}x{h}", batch=batch, frames=tally.frames,
        wall_s=wall, latency_ms=latency_stats(tally.latencies_ms), dropped=dropped, paced=config.paced,
        target_fps=fps if config.paced else None, stage_ms=summary.stage_ms, bottleneck=summary.bottleneck,
        compute_gaps=summary.compute_gaps,
        detections=tally.detections, trace=trace if trace.spans else None, per_source=per_source, calls=tally.calls,
        window_fps=window_rates(tally.done_s),
        admission={} if admission is None else {"message": admission.message, "admitted": len(admission.admitted),
                                                "queued": len(admission.queued), "refused": len(admission.refused),
                                                "capacity_fps": admission.capacity_fps,
                                                "demand_fps": admission.demand_fps},
    )


def _per_source(sources: Sequence[FrameSource], tally: _Tally, wall_s: float,
                live: dict[int, dict[str, int]] | None = None,
                admission: Admission | None = None) -> list[dict[str, Any]]:
    """Per-source achieved FPS, latency (capture -> result), drops (live streams: their queue's) and,
    for cameras, their drop/reconnect counters; refused and never-started sources say so."""
    out: list[dict[str, Any]] = []
    refused = set(admission.refused) if admission is not None else set()
    for s, source in enumerate(sources):
        lat = latency_stats(tally.by_source.get(s, []))
        frames = len(tally.by_source.get(s, []))
        row: dict[str, Any] = {"source": source.info.name, "frames": frames, "fps": frames / wall_s,
                               "p50_ms": lat.get("p50"), "p99_ms": lat.get("p99")}
        if live is not None:
            state = "refused" if s in refused else ("ran" if s in live else "queued, never started")
            row.update(state=state, **live.get(s, {"produced": 0, "delivered": 0, "dropped": 0}))
        stats = getattr(source, "stats", None)
        if callable(stats):  # a camera (streamrt.video.cameras): drops in its bounded queue, reconnects
            camera = {k: v for k, v in stats().to_dict().items() if k != "name"}
            if live is not None and "dropped" in camera:  # the live queue's drops are the stream's
                camera["camera_dropped"] = camera.pop("dropped")
            row.update(camera)
        out.append(row)
    return out


WINDOWS = 5
"""A run's frames are cut into this many windows to measure how steady its throughput was."""


def window_rates(done_s: list[float], windows: int = WINDOWS) -> list[float]:
    """Frames per second of ``windows`` consecutive, equal-sized groups of completed frames.

    One run cannot be repeated the way ``demo`` repeats its rounds (the source is consumed), so
    its steadiness is read from within: a machine that slowed down in the middle shows as one slow
    window. Empty when there are too few frames (fewer than two per window).
    """
    n = len(done_s)
    if n < 2 * windows:
        return []
    # From the first completion on: the pipeline's fill time (the first frame's latency) is not a rate.
    rates = []
    previous = done_s[0]
    for w in range(windows):
        chunk = done_s[w * n // windows:(w + 1) * n // windows]
        count = len(chunk) - (1 if w == 0 else 0)
        span = chunk[-1] - previous
        if span > 0:
            rates.append(count / span)
        previous = chunk[-1]
    return rates
