"""The main demo: the bundled detector on a generated clip, synchronous loop vs pipeline, side by side.

Steps (:func:`run_demo`):

1. build (or reuse from the cache) a plan of the bundled detector with the best backend here
   (TensorRT, else the GPU backend, else ONNX Runtime on the CPU), written to ``out_dir``; on the
   CPU a second plan whose sessions use one thread each, for the pipeline's parallel lanes;
2. write the sample clip (:class:`~streamrt.video.synthetic.SyntheticClip`, moving shapes) as an
   MP4 file unless it is there already, and decode it into memory, so both runs see the same frames
   and decoding stays out of the comparison;
3. run it through the synchronous loop (``topology=sync``) and through the pipeline, ``rounds``
   times each, interleaved; the median run of each is reported with the spread of the rounds, and
   the speed-up only when the synchronous baseline was steady (:mod:`streamrt.measure.rounds`);
4. check both gave the same detections, score them against the clip's ground truth (mAP@0.5),
   and write the annotated video, the detections (JSON Lines), both run reports and timelines.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamrt.measure.rounds import Rounds, ratio
from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.video.metrics import mean_average_precision
from streamrt.video.model import DetectorModel, best_backend, bundled_labels, bundled_model, open_detector
from streamrt.video.report import RunReport, write_report_files
from streamrt.video.runner import DetectConfig, run_detection
from streamrt.video.sinks import JsonlSink, VideoSink
from streamrt.video.sources import ArraySource, SourceError, VideoFileSource, iter_frames
from streamrt.video.synthetic import SyntheticClip
from streamrt.video.tuning import default_pipeline, lane_options
from streamrt.video.workload import Detections, Frame

__all__ = ["DemoConfig", "DemoResult", "default_pipeline", "run_demo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs. Sizes default per device: 1080p x 300 frames on CUDA, 720p x 150 on the CPU."""

    out_dir: Path = Path("out/demo")
    width: int | None = None
    height: int | None = None
    frames: int | None = None
    fps: float = 30.0
    seed: int = 0
    backend: str | None = None
    pipeline: PipelineConfig | None = None
    batch: int = 1
    warmup_frames: int = 10
    rounds: int = 3
    cache_dir: Path | None = None


@dataclass
class DemoResult:
    """Both runs, the speed-up, whether they agree, the accuracy, and the files written.

    ``detector`` and ``plan`` are the pipeline's; ``sync_detector`` is the one the synchronous loop
    ran (on the CPU another plan: all cores for one session, while each pipeline lane has one thread).
    """

    detector: DetectorModel
    plan: Path
    sync: RunReport
    pipeline: RunReport
    identical: bool
    map50: float
    files: dict[str, Path] = field(default_factory=dict)
    rounds: dict[str, Rounds] = field(default_factory=dict)
    sync_detector: DetectorModel | None = None

    @property
    def plans(self) -> dict[str, str]:
        """The plan file each run used, by run name (``sync``, ``pipeline``)."""
        sync = self.sync_detector or self.detector
        return {"sync": sync.source, "pipeline": self.detector.source}

    @property
    def speedup(self) -> float | None:
        """Median pipeline FPS over median sync FPS; None when the sync rounds were too noisy to trust."""
        if self.rounds:
            return ratio(self.rounds["pipeline"], self.rounds["sync"])
        return self.pipeline.fps / self.sync.fps if self.sync.fps > 0 else None


def _sample(path: Path, clip: SyntheticClip) -> list[np.ndarray]:
    """The clip's frames decoded from its MP4 file (written first when missing or different)."""
    try:
        source = VideoFileSource(path)
        if source.info.frames == clip.frames and (source.info.width, source.info.height) == (clip.width, clip.height):
            frames = list(iter_frames(source))
            source.close()
            if len(frames) == clip.frames:
                return frames
    except SourceError:
        pass
    from streamrt.video._cv2 import import_cv2

    cv2 = import_cv2()
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), clip.fps, (clip.width, clip.height))
    for frame in clip:
        writer.write(frame)
    writer.release()
    source = VideoFileSource(path)
    frames = list(iter_frames(source))
    source.close()
    return frames


def _plan(backend: str, options: dict[str, Any], config: DemoConfig, out: Path, say: Callable[[str], None]) -> Path:
    from streamrt.building.builder import build
    from streamrt.onnx.model import load_model
    from streamrt.video.model import detector_build_config

    source = load_model(bundled_model())
    spec = source.inputs[0]
    build_config = detector_build_config(backend, spec, max_batch=max(16, config.batch),
                                         opt_batch=config.batch)
    if options:
        build_config = build_config.replace(backend_options=options)
    suffix = "".join(f"-{k}{v}" for k, v in options.items())
    plan = out / f"shapes_detector.{backend}{suffix}.plan"
    say(f"plan for the bundled detector: {backend} {build_config.precision.value}"
        + (f" {options}" if options else ""))
    built = build(source, build_config, plan, cache_dir=config.cache_dir, progress=say)
    say(f"{'reused' if built.cached else 'built'} {plan} in {built.seconds:.1f} s")
    return plan


def _run(detector: DetectorModel, frames: list[np.ndarray], config: DetectConfig,
         fps: float) -> tuple[RunReport, list[Detections]]:
    results: list[Detections] = []

    def keep(frame: Frame, detections: Detections) -> None:
        results.append(detections)

    report = run_detection(detector, [ArraySource(frames, fps=fps, name="sample")], config, on_result=keep)
    return report, results


def run_demo(config: DemoConfig = DemoConfig(), progress: Callable[[str], None] | None = None) -> DemoResult:
    """Run the demo (see the module docstring) and return its results."""
    from streamrt.device import cuda_available

    say = progress or log.info
    cuda = cuda_available()
    width = config.width or (1920 if cuda else 1280)
    height = config.height or (1080 if cuda else 720)
    count = config.frames or (300 if cuda else 150)
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    backend = config.backend or best_backend()
    pipeline = config.pipeline or default_pipeline(cuda)
    sync_plan = _plan(backend, {}, config, out, say)
    options = lane_options(backend, pipeline, cuda)
    lane_plan = _plan(backend, options, config, out, say) if options else sync_plan
    detectors = {"sync": open_detector(sync_plan, labels=bundled_labels())}
    detectors["pipeline"] = open_detector(lane_plan, labels=bundled_labels()) if options else detectors["sync"]
    clip = SyntheticClip(width=width, height=height, frames=count, fps=config.fps, seed=config.seed)
    video = out / f"sample_{width}x{height}_{count}.mp4"
    frames = _sample(video, clip)
    say(f"sample clip {video} ({count} frames {width}x{height}) decoded into memory")

    loops = {
        "sync": PipelineConfig(topology=Topology.SYNC, trace=True),
        "pipeline": pipeline.replace(trace=True),
    }
    runs: dict[str, list[RunReport]] = {name: [] for name in loops}
    detections: dict[str, list[Detections]] = {}
    for r in range(config.rounds):  # interleaved, so a machine whose speed drifts affects both alike
        for name, pcfg in loops.items():
            cfg = DetectConfig(pipeline=pcfg, batch=config.batch, warmup_frames=config.warmup_frames)
            report, found = _run(detectors[name], frames, cfg, config.fps)
            runs[name].append(report)
            detections.setdefault(name, found)
            say(f"round {r + 1}/{config.rounds}: {name} ({pcfg.describe()}) {report.fps:.1f} FPS")
    reports = {name: sorted(done, key=lambda rep: rep.fps)[(len(done) - 1) // 2] for name, done in runs.items()}
    sync, piped = detections["sync"], detections["pipeline"]
    identical = len(sync) == len(piped) and all(a.same_as(b, atol=1e-3) for a, b in zip(sync, piped, strict=True))
    truths = [(clip.ground_truth(d.index).boxes, clip.ground_truth(d.index).classes) for d in piped]
    preds = [(d.boxes, d.scores, d.classes) for d in piped]
    detector = detectors["pipeline"]
    map50 = mean_average_precision(preds, truths, detector.num_classes).map

    files: dict[str, Path] = {"plan": sync_plan, "lane plan": lane_plan, "sample": video}
    files["video"] = out / "annotated.mp4"
    files["detections"] = out / "detections.jsonl"
    sink = VideoSink(files["video"], fps=config.fps, size=(width, height), names=detector.names)
    jsonl = JsonlSink(files["detections"], detector.names)
    for det in piped:
        frame = Frame(0, det.index, frames[det.index])
        sink(frame, det)
        jsonl(frame, det)
    sink.close()
    jsonl.close()
    for name, report in reports.items():
        for path in write_report_files(report, out, name):
            files[f"{name}:{path.name}"] = path
    rounds = {name: Rounds.of(rep.fps for rep in done) for name, done in runs.items()}
    files["summary"] = out / "demo.json"
    result = DemoResult(detector, lane_plan, reports["sync"], reports["pipeline"], identical, map50, files, rounds,
                        sync_detector=detectors["sync"])
    summary = {"speedup": result.speedup, "identical": identical, "map50": map50,
               "rounds_fps": {name: list(r.values) for name, r in rounds.items()},
               "rounds_noisy": {name: r.noisy for name, r in rounds.items()},
               "frames_measured": count - config.warmup_frames,
               "sync": reports["sync"].to_dict(), "pipeline": reports["pipeline"].to_dict()}
    files["summary"].write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return result
