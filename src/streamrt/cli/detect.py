"""``streamrt detect``: object detection on videos, image folders or generated clips, through the pipeline.

SOURCE is a video file, a folder of images, an image, or ``synthetic[:WxHxN@FPS]``; several
sources run as cameras batched into the engine. The model is a YOLO ONNX export (YOLOv5 or
YOLOv8/YOLO11 layout; class names from its metadata, ``--labels`` or ``MODEL.txt``) or a plan;
ONNX files are built through the cache with the best backend here unless ``--backend`` names one.
Outputs: ``-o/--output`` annotated video, ``--jsonl`` detections as JSON Lines, ``--report DIR`` the run
report (JSON, markdown, PNG timeline, Chrome trace). See ``docs/detection.md``.

Without pipeline flags the run uses the demo's choice for this machine: on a GPU one lane with a
stream per stage and CUDA graphs; on the CPU one lane per core, each with a one-thread session.
Throughput is also measured over windows of frames: the median window with the spread, and a
warning when the machine was noisy (the rule ``bench`` uses).

``--paced`` runs every source as a live camera at ``--fps`` (its own thread, a drop-oldest queue of
``--queue-depth`` frames, served round-robin) behind admission control: the decode and engine
capacity for this codec, resolution and plan are measured once (or read from the cache,
``--remeasure`` to measure again), the streams that fit within ``--headroom`` of it are admitted
and the rest refused (``--admission queue`` starts them as others end, ``off`` runs them all).
The output ends with one row per stream: achieved FPS, frames dropped, p50/p99 capture-to-result.

``--decode-processes N`` decodes the video files with NVDEC in N worker processes, each picture
handed to the detector on the device by CUDA IPC (:mod:`streamrt.video.decode_processes`: one
process binds NVDEC at ~2,000-2,800 frames/s on an H200, 4 reach its engines' bound); 0, the
default, decodes in this process as before. Admission then measures NVDEC in those processes.
``--hybrid`` adds CPU decoder processes (one core each) for the streams NVDEC cannot take
(:mod:`streamrt.video.hybrid`): both sides' capacity is measured at once before the run, the streams
are planned within ``--headroom`` of each side (default 0.85 with ``--hybrid``, 0.9 otherwise), and
admission counts both.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamrt.cli.args import CacheArgs, PipelineArgs, add_alias, backend_choices, plain_text
from streamrt.video.hybrid_policy import DEFAULT_HEADROOM

if TYPE_CHECKING:
    from collections.abc import Callable

    from streamrt.pipeline.config import PipelineConfig
    from streamrt.video.admission import Admission
    from streamrt.video.model import DetectorModel
    from streamrt.video.runner import DetectConfig
    from streamrt.video.sources import FrameSource
    from streamrt.video.workload import Detections, Frame

__all__ = ["add_detect_arguments", "register", "run"]

ADMISSION_HEADROOM = 0.9
"""``--headroom``'s default: the share of the measured capacity admission plans up to (``AdmissionConfig``'s)."""
HYBRID_HEADROOM = DEFAULT_HEADROOM
"""``--headroom``'s default with ``--hybrid``: the hybrid policy's own (two kinds of decoders measured at once on
shared cores vary more than one). Not shown to be enough yet: at 0.9 an H100 dropped 2-7 frames of ~20,000 in 4 s
runs of 162-167 streams, at 0.85 an H200 dropped 422 in a 15 s run of 159 (docs/benchmarks/2026-12-06-s4.md)."""

# detect's pipeline flags. With none given, the demo's choice for this machine (pipeline_config);
# with some, the others default to a stream per stage and 4 frames in flight. Traced for the report.
_PIPELINE = PipelineArgs(defaults={"topology": "streams", "ring_size": 4, "trace": True})


def add_detect_arguments(parser: argparse.ArgumentParser) -> None:
    """Model, pipeline and post-processing flags (shared with ``streamrt demo``)."""
    model = parser.add_argument_group("model")
    model.add_argument("--backend", default=None, choices=backend_choices(),
                       help="backend for ONNX models (default: the best available)")
    model.add_argument("--precision", default=None, choices=["fp32", "fp16", "bf16"],
                       help="default fp16 on GPU backends, fp32 on ONNX Runtime")
    model.add_argument("--max-batch", type=int, default=16, help="largest batch of the built plan (default 16)")
    model.add_argument("--layout", default=None, help="output layout: yolov8, yolov5, yolov8t (default: detect)")
    CacheArgs().add_to(parser, model)
    pipe = _PIPELINE.group.add_to(parser)
    pipe.add_argument("--batch", type=int, default=0, help="frames per engine call (default: one per source)")
    post = parser.add_argument_group("post-processing")
    post.add_argument("--conf", type=float, default=0.25, help="score threshold (default 0.25)")
    post.add_argument("--iou", type=float, default=0.45, help="NMS IoU threshold (default 0.45)")
    post.add_argument("--max-det", type=int, default=300, help="detections kept per frame (default 300)")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "detect", help="detect objects in videos, image folders or generated clips through the pipeline",
        description=plain_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sources", nargs="+", metavar="SOURCE",
                        help="video file, image folder, image, synthetic[:WxHxN@FPS]")
    parser.add_argument("--model", type=Path, default=None, help="ONNX file or plan (default: the bundled detector)")
    parser.add_argument("--labels", type=Path, default=None, help="class names, one per line")
    output = parser.add_argument("-o", "--output", type=Path, default=None, metavar="VIDEO",
                                 help="annotated video (.mp4/.avi); several sources: name_<i>")
    add_alias(parser, "--out", output)
    jsonl = parser.add_argument("--jsonl", type=Path, default=None, metavar="FILE",
                                help="write the detections as JSON Lines")
    add_alias(parser, "--json", jsonl)  # --json elsewhere prints the result as JSON on stdout
    parser.add_argument("--report", type=Path, default=None, metavar="DIR", help="run report, timeline and trace")
    parser.add_argument("--paced", action="store_true", help="camera-paced: frames arrive at --fps, late ones drop")
    parser.add_argument("--fps", type=float, default=None, help="pacing rate per source (default: the source's)")
    live = parser.add_argument_group("live streams and admission (with --paced)")
    live.add_argument("--admission", default="refuse", choices=["refuse", "queue", "off"],
                      help="streams beyond the measured capacity: refuse (default), queue until one ends, "
                           "or off (run all; every stream drops frames evenly)")
    live.add_argument("--headroom", type=float, default=None,
                      help=f"plan up to this fraction of the measured capacity (default {ADMISSION_HEADROOM}; "
                           f"{HYBRID_HEADROOM} with --hybrid)")
    live.add_argument("--remeasure", action="store_true",
                      help="measure decode and engine capacity again instead of reading the cached record")
    live.add_argument("--queue-depth", type=int, default=2,
                      help="frames each stream holds; beyond it its oldest frame is dropped (default 2)")
    live.add_argument("--lockstep", action="store_true",
                      help="the older paced mode: one frame of every source per tick, no admission")
    parser.add_argument("--max-frames", type=int, default=None, help="stop after N frames per source")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--decode-processes", type=int, default=0, metavar="N",
                        help="decode the video files with NVDEC in N worker processes, pictures handed over on the "
                             "GPU (default 0: decode in this process)")
    parser.add_argument("--hybrid", action="store_true",
                        help="with --decode-processes: CPU decoder processes take the streams NVDEC cannot "
                             "(both sides measured at once, streams planned within --headroom of each)")
    parser.add_argument("--cpu-decoders", type=int, default=0, metavar="M",
                        help="with --hybrid: CPU decoder processes, one core each (default 0: the cores less 2 for "
                             "this process and one per NVDEC decoder process)")
    parser.add_argument("--gpus", default=None, metavar="0,1",
                        help="spread the sources round-robin over these GPUs: a detector and a pipeline on each")
    add_detect_arguments(parser)
    parser.set_defaults(func=run)


class ProgressBar:
    """A one-line progress bar on stderr, redrawn at most 10 times a second (only on a terminal)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.started = time.perf_counter()
        self._drawn = 0.0

    def __call__(self, done: int, total: int | None) -> None:
        now = time.perf_counter()
        if not self.enabled or (now - self._drawn < 0.1 and done != total):
            return
        self._drawn = now
        rate = done / max(now - self.started, 1e-9)
        if total:
            filled = int(30 * done / total)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {done}/{total}"
        else:
            bar = f"{done} frames"
        print(f"\r  {bar} {rate:.1f} FPS", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


def pipeline_config(args: argparse.Namespace, cuda: bool) -> PipelineConfig:
    """The pipeline flags over topology streams, ring 4; with none of them, the demo's choice for this
    machine (:mod:`streamrt.video.tuning`)."""
    from streamrt.video.tuning import default_pipeline

    if not _PIPELINE.group.given(args):
        return default_pipeline(cuda).replace(trace=True)
    return _PIPELINE.config(args)


def detect_config(args: argparse.Namespace, *, paced: bool = False) -> DetectConfig:
    """A :class:`~streamrt.video.runner.DetectConfig` from the shared flags."""
    from streamrt.device import cuda_available
    from streamrt.ops.postprocess import PostprocessConfig
    from streamrt.video.runner import DetectConfig

    pipeline = pipeline_config(args, cuda_available())
    return DetectConfig(
        postprocess=PostprocessConfig(conf=args.conf, iou=args.iou, max_det=args.max_det),
        pipeline=pipeline, batch=args.batch, paced=paced, fps=getattr(args, "fps", None),
        max_frames=getattr(args, "max_frames", None),
        live=paced and not getattr(args, "lockstep", False), queue_depth=getattr(args, "queue_depth", 2) or 2,
    )


def open_model(args: argparse.Namespace, path: Path | None, labels: Path | None = None,
               pipeline: PipelineConfig | None = None) -> DetectorModel:
    """The detector; an ONNX file is built for ``pipeline``'s lanes (one thread each for several CPU lanes)."""
    from streamrt.cli.common import stderr_progress
    from streamrt.device import cuda_available
    from streamrt.video.model import best_backend, bundled_model, open_detector
    from streamrt.video.tuning import lane_options

    backend = args.backend or best_backend()
    options = lane_options(backend, pipeline, cuda_available()) if pipeline is not None else {}
    return open_detector(path or bundled_model(), backend=backend, labels=labels, layout=args.layout,
                         max_batch=args.max_batch, precision=args.precision, cache=CacheArgs.use_cache(args),
                         cache_dir=CacheArgs.cache_dir(args), progress=stderr_progress, options=options)


def run(args: argparse.Namespace) -> int:
    from streamrt.cli.common import check_output, require_file

    if args.model is not None:
        require_file(Path(args.model))  # the words build, inspect and bench use

    for path, flag, example in ((args.output, "-o", "annotated.mp4"), (args.jsonl, "--jsonl", "detections.jsonl")):
        if path is not None:
            check_output(path, example=example, flag=flag)
    if args.report is not None:
        check_output(args.report, directory=True, flag="--report")
    config = detect_config(args, paced=args.paced)
    from streamrt.errors import ConfigError

    if args.hybrid and not args.decode_processes:
        raise ConfigError("--hybrid spreads streams over NVDEC and CPU decoder processes",
                          hint="add --decode-processes N (4 reach NVDEC's bound on an H200)")
    if (args.cpu_decoders and not args.hybrid) or args.cpu_decoders < 0:
        raise ConfigError(f"--cpu-decoders sets the CPU decoder processes of --hybrid (>= 1), got {args.cpu_decoders}",
                          hint="add --hybrid, or drop --cpu-decoders")
    if args.headroom is not None:  # refused now, not after the decoders are opened and measured
        from streamrt.video.admission import AdmissionConfig

        AdmissionConfig(args.admission, args.headroom)
    # Sources next: a missing or unreadable video must fail before minutes of building.
    decoders = _decoder_processes(args) if args.decode_processes else None
    try:
        return _open_and_detect(args, config, decoders)
    finally:
        if decoders is not None:
            decoders.close()


def _open_and_detect(args: argparse.Namespace, config: DetectConfig, decoders: Any) -> int:
    """Open the sources (``decoders``' streams, or each SOURCE here), then the detector, and run."""
    from streamrt.video.sources import open_source

    sources: list[Any] = [] if decoders is None else list(decoders.sources())
    try:
        if decoders is None:
            for spec in args.sources:
                sources.append(open_source(spec))
        if args.gpus is not None:
            return _detect_on_gpus(args, sources, config)
        detector = open_model(args, args.model, args.labels, config.pipeline)
    except BaseException:
        for source in sources:
            source.close()
        raise
    return _detect(args, detector, sources, config, decoders)


def _headroom(args: argparse.Namespace) -> float:
    """``--headroom``, or its default for this run's decoders."""
    if args.headroom is not None:
        return float(args.headroom)
    return HYBRID_HEADROOM if getattr(args, "hybrid", False) else ADMISSION_HEADROOM


def _decoder_processes(args: argparse.Namespace) -> Any:
    """``--decode-processes N``: the video files on NVDEC in N decoder processes (a ProcessDecodePool), or with
    ``--hybrid`` over NVDEC and CPU decoder processes (a HybridDecode, which measures both sides first).

    Raises:
        ConfigError: a negative count, ``--gpus`` or ``-o`` with it, or no NVDEC here.
    """
    from streamrt.errors import ConfigError
    from streamrt.video.decode_nvdec import nvdec_available
    from streamrt.video.decode_processes import ProcessDecodePool

    n = args.decode_processes
    if n < 0:
        raise ConfigError(f"--decode-processes must be >= 0 (0: decode in this process), got {n}")
    if args.gpus is not None:
        raise ConfigError("--decode-processes decodes for one GPU", hint="drop --gpus or --decode-processes")
    if args.output is not None:
        raise ConfigError("--decode-processes delivers NV12 pictures on the GPU; -o/--output draws on BGR frames",
                          hint="write detections with --jsonl, or drop --decode-processes")
    if not nvdec_available():
        raise ConfigError("--decode-processes needs NVDEC: a CUDA GPU and PyNvVideoCodec",
                          hint="pip install 'streamrt[nvdec]' on a GPU machine, or drop --decode-processes")
    if args.hybrid:
        from streamrt.video.hybrid import HybridDecode

        return HybridDecode(args.sources, fps=args.fps, decode_processes=n, headroom=_headroom(args),
                            cpu_processes=args.cpu_decoders or None)
    return ProcessDecodePool(args.sources, processes=n)


def _detect_on_gpus(args: argparse.Namespace, sources: list[FrameSource], config: DetectConfig) -> int:
    """``--gpus``: the sources dealt over the GPUs (:mod:`streamrt.video.multi_gpu`), JSON Lines and the
    report per GPU; an annotated video is written by one-GPU runs only."""
    import json

    import torch

    from streamrt.errors import ConfigError
    from streamrt.video.multi_gpu import parse_gpus, run_detection_on_gpus
    from streamrt.video.report import write_report_files
    from streamrt.video.sinks import JsonlSink, ThreadedSink
    from streamrt.video.sources import Prefetch

    if args.output is not None:
        raise ConfigError("--gpus writes detections (--jsonl) and reports (--report), not an annotated video",
                          hint="drop -o/--output, or run on one GPU")
    gpus = parse_gpus(args.gpus, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    sink: ThreadedSink | None = None
    names: list[tuple[str, ...]] = []

    def opener() -> DetectorModel:
        model = open_model(args, args.model, args.labels, config.pipeline)
        names.append(model.names)
        return model

    def deliver(frame: Frame, detections: Detections) -> None:  # one call at a time (run_detection_on_gpus)
        nonlocal sink
        if sink is None:
            sink = ThreadedSink(JsonlSink(args.jsonl, names[0], [s.info for s in sources]))
        sink(frame, detections)

    feeds = [Prefetch(s) for s in sources]
    try:
        report = run_detection_on_gpus(opener, feeds, config, gpus,
                                       on_result=deliver if args.jsonl is not None else None)
    except BaseException:
        if sink is not None:
            sink.abort()
        raise
    finally:
        for feed in feeds:
            feed.close()
    if sink is not None:
        sink.close()
        print(f"wrote detections: {args.jsonl}")
    print(report.format_text())
    if args.report is not None:
        for gpu, run in report.runs.items():
            for path in write_report_files(run, args.report, f"detect_gpu{gpu}"):
                print(f"wrote {path}")
        (args.report / "detect_gpus.json").write_text(json.dumps(report.to_dict(), indent=2, default=str))
        print(f"wrote {args.report / 'detect_gpus.json'}")
    return 0


def _detect(args: argparse.Namespace, detector: DetectorModel, sources: list[FrameSource],
            config: DetectConfig, decoders: Any = None) -> int:
    from streamrt.pipeline.collector import realtime_collector
    from streamrt.video.report import write_report_files
    from streamrt.video.runner import run_detection
    from streamrt.video.sinks import JsonlSink, Sink, ThreadedSink, VideoSink
    from streamrt.video.sources import Prefetch

    sinks: list[Sink] = []
    feeds: list[FrameSource] = []
    try:
        names = detector.names
        first = sources[0].info
        if args.jsonl is not None:
            sinks.append(ThreadedSink(JsonlSink(args.jsonl, names, [s.info for s in sources])))
        if args.output is not None:
            size = (first.width, first.height)
            sinks.append(ThreadedSink(VideoSink(args.output, fps=args.fps or first.fps, size=size,
                                                sources=len(sources), names=names)))
        # a decoder pool's streams decode ahead in their pool, and are read together from it (pool_lane)
        feeds = [s if getattr(s, "pool_lane", None) is not None else Prefetch(s) for s in sources]

        def deliver(frame: Frame, detections: Detections) -> None:
            for sink in sinks:
                sink(frame, detections)

        admission = _admit(args, detector, sources, config, decoders) if config.paced and config.live else None
        if admission is not None and decoders is not None:
            for i in admission.refused:  # never started: their decoders stop now, not at the end of the run
                decoders.remove(i)
        bar = ProgressBar(not args.no_progress)
        try:
            # the detector, the sources and the sinks are open: frozen out of the run's collections
            with realtime_collector():
                report = run_detection(detector, feeds, config, on_result=deliver if sinks else None, progress=bar,
                                       admission=admission)
        finally:
            bar.close()
    except BaseException:
        # A failed run leaves no output behind: each sink deletes its temporary file.
        for sink in sinks:
            sink.abort()
        raise
    finally:
        for feed in feeds:
            feed.close()
        if not feeds:
            for source in sources:
                source.close()
    for sink in sinks:
        sink.close()
    summary = getattr(decoders, "summary", None)
    if callable(summary):  # --hybrid: each side's streams and capacity, the binding side, the moves made
        report.decode = summary()
    print(report.format_text())
    if config.paced:
        from streamrt.video.report import per_stream_table

        print(per_stream_table(report))
    for label, path in (("annotated video", args.output), ("detections", args.jsonl)):
        if path is not None:
            print(f"wrote {label}: {path}")
    if args.report is not None:
        for path in write_report_files(report, args.report, "detect"):
            print(f"wrote {path}")
    return 0


def _admit(args: argparse.Namespace, detector: DetectorModel, sources: list[FrameSource],
           config: DetectConfig, decoders: Any = None) -> Admission:
    """Measure (or read) the capacity, decide which streams run, print the line that says so. Decoder processes
    are measured as they run (NVDEC in those processes; with ``--hybrid`` the hybrid's own measurement of both
    sides at once, made when it opened).

    Raises:
        ConfigError: not one stream fits (the message names the capacity and the demand).
    """
    from streamrt.errors import ConfigError
    from streamrt.video.admission import AdmissionConfig, plan_admission
    from streamrt.video.capacity import capacity_for

    first = sources[0].info
    fps = config.fps or first.fps or 30.0
    batch = config.batch or min(len(sources), detector.max_batch)
    decoder, measure, remeasure = _decode_measurement(args, decoders, len(sources))
    record = capacity_for(detector, args.sources[0], first.width, first.height, batch=batch,
                          cache_dir=CacheArgs.cache_dir(args), remeasure=remeasure, decoder=decoder,
                          measure_decode=measure)
    plan = plan_admission([fps] * len(sources), record, AdmissionConfig(args.admission, _headroom(args)))
    print(f"capacity: decode {record.decode_fps:,.0f} frames/s ({record.decoder}), engine {record.engine_fps:,.0f} "
          f"frames/s (batch {record.batch}), measured {record.age_s:,.0f} s ago; --remeasure to measure again")
    print(plan.message)
    if not plan.admitted:
        raise ConfigError(plan.message, hint="lower --fps, or --admission off to try anyway")
    return plan


def _decode_measurement(args: argparse.Namespace, decoders: Any,
                        streams: int) -> tuple[str | None, Callable[[], float] | None, bool]:
    """The decoder's name for the capacity record, how to measure it, and whether to measure again (``None, None``:
    this process's own decoder, :func:`~streamrt.video.capacity.capacity_for`'s probe)."""
    if decoders is None:
        return None, None, args.remeasure
    measured = getattr(decoders, "measured", None)
    if measured is not None:  # the hybrid measured both sides at once when it opened: that is the capacity
        name = f"nvdec+cpu ({args.decode_processes} NVDEC + {measured['cpu_decoders']} CPU decoder processes)"
        return name, lambda: float(measured["nvdec"] + measured["cpu"]), True
    from streamrt.video.hybrid_capacity import measure_process_decode

    n, sessions = args.decode_processes, min(streams, 16)  # (a record of 3 sessions would under-state 150 streams)
    return (f"nvdec in {n} decoder processes, {sessions} sessions",
            lambda: measure_process_decode(args.sources[0], processes=n, sessions=sessions), args.remeasure)
