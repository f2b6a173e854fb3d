"""Benchmark: real-time detection, synchronous loop vs pipeline topologies, and camera-paced N-stream sweep.

Part 1, throughput: the same detector and the same decoded frames (generated clip, 1080p by default)
through (a) the synchronous loop and the pipeline topologies (stage per stream, replicated lanes,
CUDA graphs on a GPU), rounds interleaved, median reported (:func:`streamrt.pipeline.bench.compare`),
with every case's detections checked against the synchronous loop's.

Part 2, capacity: N cameras at ``--fps`` each (camera-paced: late frames drop), batched into the
engine, for N in ``--streams`` (on CUDA the frames sit in pinned memory, as a decoder writing into
page-locked buffers delivers them; ``--pageable-sweep`` measures the staging copy instead); a point
is sustained with no dropped frame and p99 latency under 100 ms. The largest sustained N is the
DeepStream-style figure; the busiest resource of the traced run at the first unsustained N says
where the bound lies.

Usage::

    python benchmarks/detection.py --out /tmp/detection-cpu                     # CPU defaults (~2 min)
    python benchmarks/detection.py --device cuda --out /tmp/detection-h200      # GPU defaults
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np

from streamrt.device import cuda_available
from streamrt.pipeline.collector import realtime_collector
from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.profiling.provenance import git_commit
from streamrt.video import ArraySource, DetectConfig, Detections, Frame, SyntheticClip, open_detector, run_detection
from streamrt.video.model import LANE_OPTIONS, DetectorModel, bundled_labels, bundled_model
from streamrt.video.report import LATENCY_BUDGET_MS, RunReport, write_report_files

log = logging.getLogger("detection-bench")

DEFAULTS = {
    "cuda": {"items": 600, "warmup": 50, "streams": "1,8,16,32,64,96,128,160,192,256,320", "duration": 5.0,
             "trace_items": 120, "workers": "2,4"},
    "cpu": {"items": 200, "warmup": 10, "streams": "1,2,4,8,12,16,20,24,32", "duration": 4.0, "trace_items": 60,
            "workers": "2"},
}


@dataclass(frozen=True)
class Case:
    """One configuration of part 1: a pipeline and the plan it runs (``lane``: :data:`LANE_OPTIONS`)."""

    name: str
    pipeline: PipelineConfig
    plan: str = "default"
    switch_ms: float | None = None  # the interpreter's GIL switch interval while it runs (None: as it is)
    env: tuple[tuple[str, str], ...] = ()  # environment variables set while it runs (read when the lanes are made)


def cases(cuda: bool, workers: list[int]) -> list[Case]:
    """(a) sync, (b) stage per stream (on CUDA also with a launch thread), (c) replicated lanes, (b+c) both; on
    CUDA every one also with graphs, the synchronous loop included, so overlap on streams and CUDA graphs are
    measured apart.

    On the CPU, replicated lanes run the single-thread plan (one intra-op thread per session), and
    the synchronous loop is measured with both plans.
    """
    lane = "default" if cuda else "lane"
    out = [Case("(a) sync", PipelineConfig(topology=Topology.SYNC))]
    if not cuda:
        out.append(Case("(a) sync", PipelineConfig(topology=Topology.SYNC), lane))
    out.append(Case("(b) streams", PipelineConfig(topology=Topology.STREAMS, ring_size=4)))
    if cuda:  # the CUDA stages after `load` launched by a thread of their own (no CUDA stage on the CPU)
        out.append(Case("(b) streams launcher", PipelineConfig(topology=Topology.STREAMS, ring_size=4,
                                                              launch_thread=True)))
        # (a 0.5 ms GIL switch interval beside it changed nothing on the H200 on 2026-12-03: 0.98x / 1.01x,
        # docs/benchmarks/2026-12-03-h200-s2.md; Case.switch_ms keeps the lever)
        # the post-processing's torch steps (~25 launches per frame) instead of the fused Triton kernels (6, the
        # default), A/B
        unfused = (("STREAMRT_FUSED_POSTPROCESS", "0"),)
        out.append(Case("(a) sync, post torch", PipelineConfig(topology=Topology.SYNC), env=unfused))
        out.append(Case("(b) streams, post torch", PipelineConfig(topology=Topology.STREAMS, ring_size=4),
                        env=unfused))
    for w in workers:
        out.append(Case(f"(c) single x{w}", PipelineConfig(topology=Topology.SINGLE, workers=w, ring_size=4), lane))
        out.append(Case(f"(b+c) streams x{w}", PipelineConfig(topology=Topology.STREAMS, workers=w, ring_size=4),
                        lane))
        if cuda:  # each lane with its own launcher: two threads launching, the engine's launches without the GIL
            out.append(Case(f"(b+c) streams launcher x{w}", PipelineConfig(
                topology=Topology.STREAMS, workers=w, ring_size=4, launch_thread=True), lane))
    if cuda:
        out += [replace(c, name=c.name + " graphs", pipeline=c.pipeline.replace(cuda_graphs=True)) for c in out
                if not c.env]  # a replayed graph launches the post stage once, fused or not
    return out


def _measure(detector: DetectorModel, frames: list[np.ndarray], case: Case, items: int, warmup: int,
             trace: bool) -> tuple[RunReport, list[Detections]]:
    found: list[Detections] = []

    def keep(frame: Frame, det: Detections) -> None:
        if frame.index >= warmup and len(found) < len(frames):
            found.append(det)

    source = ArraySource(frames, loop=True, length=warmup + items, name="frames")
    config = DetectConfig(pipeline=case.pipeline.replace(trace=trace), warmup_frames=warmup)
    before = sys.getswitchinterval()
    if case.switch_ms is not None:
        sys.setswitchinterval(case.switch_ms / 1000)
    try:
        with patch.dict(os.environ, dict(case.env)):
            return run_detection(detector, [source], config, on_result=keep), found
    finally:
        sys.setswitchinterval(before)


def throughput(detectors: dict[str, DetectorModel], frames: list[np.ndarray], args: argparse.Namespace,
               defaults: dict[str, Any], out: Path | None) -> tuple[list[str], list[dict[str, Any]]]:
    """Part 1: the comparison table (markdown lines) and the raw numbers."""
    cuda = detectors["default"].device == "cuda"
    table = cases(cuda, [int(w) for w in (args.workers or defaults["workers"]).split(",") if w.strip()])
    items, warmup = args.items or defaults["items"], args.warmup or defaults["warmup"]
    runs: dict[int, list[RunReport]] = {i: [] for i in range(len(table))}
    found: dict[int, list[Detections]] = {}
    for r in range(-1, args.rounds):  # round -1 warms the process up and is discarded
        for i, case in enumerate(table):
            report, dets = _measure(detectors[case.plan], frames, case, items, warmup, trace=False)
            log.info("round %d %s [%s plan]: %.1f frames/s", r, case.name, case.plan, report.fps)
            if r >= 0:
                runs[i].append(report)
                found.setdefault(i, dets)
    traced = {i: _measure(detectors[c.plan], frames, c, defaults["trace_items"], warmup, trace=True)[0]
              for i, c in enumerate(table)}
    median = {i: statistics.median(rep.fps for rep in reps) for i, reps in runs.items()}
    lines = ["| config | plan | frames/s | vs (a) | vs sync, same graphs | p50 ms | p99 ms | busiest resource (traced "
             "run) | stage ms/frame (traced) |", "|---|---|---:|---:|---:|---:|---:|---|---|"]
    sync_graphs = next((i for i, c in enumerate(table) if c.name == "(a) sync graphs"), 0)
    rows = []
    for i, case in enumerate(table):
        mid = sorted(runs[i], key=lambda rep: rep.fps)[(len(runs[i]) - 1) // 2]
        neck = traced[i].bottleneck
        stages = ", ".join(f"{k} {v:.2f}" for k, v in traced[i].stage_ms.items())
        fair = median[sync_graphs if case.pipeline.cuda_graphs else 0]
        lines.append(f"| {case.name} | {case.plan} | {median[i]:.1f} | {median[i] / median[0]:.2f}x | "
                     f"{median[i] / fair:.2f}x | "
                     f"{mid.latency_ms.get('p50', float('nan')):.1f} | {mid.latency_ms.get('p99', float('nan')):.1f} | "
                     f"{f'{neck[0]} ({100 * neck[1]:.0f}%)' if neck else '-'} | {stages} |")
        rows.append({"case": case.name, "plan": case.plan, "config": case.pipeline.to_dict(),
                     "switch_ms": case.switch_ms, "frames_per_s": median[i],
                     "rounds": [rep.fps for rep in runs[i]], "traced": traced[i].to_dict()})
        if out is not None and traced[i].trace is not None:
            slug = re.sub(r"[^a-z0-9]+", "-", f"{case.name} {case.plan}".lower()).strip("-")
            write_report_files(traced[i], out / "timelines", slug)
    differ = [table[i].name for i in found if i and not all(
        a.same_as(b, atol=1e-3) for a, b in zip(found[0], found[i], strict=True))]
    best = max(median, key=lambda i: median[i])
    lines += ["", f"- best: **{table[best].name}** ({table[best].plan} plan), {median[best]:.1f} frames/s = "
              f"{median[best] / median[0]:.2f}x the synchronous loop ({median[0]:.1f} frames/s).",
              f"- detections of the first {len(frames)} measured frames, every case vs (a): "
              + ("identical (boxes within 1e-3 px)." if not differ else f"DIFFERENT in {', '.join(differ)}.")]
    lines += fair_baselines(table, median)
    return lines, rows


def fair_baselines(table: list[Case], median: dict[int, float]) -> list[str]:
    """Streams alone vs graphs alone: each pipeline against the synchronous loop with the same graphs setting."""
    index = {c.name: i for i, c in enumerate(table) if c.plan == "default"}
    if "(a) sync graphs" not in index:
        return []
    sync, sync_g = median[index["(a) sync"]], median[index["(a) sync graphs"]]
    # the pipelines against the synchronous loop, each side with today's code (no A/B case of an older path)
    piped = {n: i for n, i in index.items() if not n.startswith("(a)") and not table[i].env}
    eager = max((i for i in piped.values() if not table[i].pipeline.cuda_graphs), key=lambda i: median[i])
    graphed = max((i for i in piped.values() if table[i].pipeline.cuda_graphs), key=lambda i: median[i])
    lines = [f"- fair baselines: streams alone (no graphs on either side, best {table[eager].name}) "
             f"**{median[eager] / sync:.2f}x** the synchronous loop; with graphs on both sides (best "
             f"{table[graphed].name} vs (a) sync graphs) **{median[graphed] / sync_g:.2f}x**; graphs alone "
             f"(sync graphs vs sync) {sync_g / sync:.2f}x."]
    pairs = [(n.replace(", post torch", ""), n) for n in index if n.endswith(", post torch")]
    if pairs := [(a, b) for a, b in pairs if a in index]:
        lines.append("- the fused post-processing kernels (6 launches per frame, the default) vs the torch steps "
                     "(~25): " + "; ".join(f"{a} {median[index[a]] / median[index[b]]:.2f}x" for a, b in pairs) + ".")
    return lines


def sweep(detector: DetectorModel, frames: list[np.ndarray], args: argparse.Namespace,
          defaults: dict[str, Any]) -> tuple[list[str], list[RunReport]]:
    """Part 2: camera-paced N-stream sweep (markdown lines and the reports)."""
    duration = args.duration or defaults["duration"]
    counts = [int(n) for n in (args.streams or defaults["streams"]).split(",") if n.strip()]
    reports: list[RunReport] = []
    lines = ["| streams | batch | offered FPS | achieved FPS | dropped | p50 ms | p99 ms | sustained "
             "| busiest resource |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    pipeline = PipelineConfig(topology=Topology.STREAMS, ring_size=args.ring, trace=True,
                              cuda_graphs=detector.device == "cuda")
    if detector.device == "cuda" and not args.pageable_sweep:
        import torch

        # As frames from a decoder that writes into page-locked buffers: the pipeline copies them to
        # the GPU directly instead of through its own pinned staging buffers.
        frames = [torch.from_numpy(f).pin_memory().numpy() for f in frames]
    failures = 0
    for n in counts:
        calls = -(-n // detector.max_batch)  # engine calls per tick, then frames split evenly between them
        batch = -(-n // calls)
        length = int(duration * args.fps)
        sources = [ArraySource(frames[i % len(frames):] + frames[: i % len(frames)], fps=args.fps, loop=True,
                               length=length, name=f"cam{i}") for i in range(n)]
        config = DetectConfig(pipeline=pipeline, batch=batch, paced=True, fps=args.fps,
                              warmup_frames=max(2, int(args.fps // 2)))
        report = run_detection(detector, sources, config)
        reports.append(report)
        neck = f"{report.bottleneck[0]} ({100 * report.bottleneck[1]:.0f}%)" if report.bottleneck else "-"
        lat = report.latency_ms
        lines.append(f"| {n} | {batch} | {n * args.fps:.0f} | {report.fps:.1f} | {report.dropped} | "
                     f"{lat.get('p50', float('nan')):.1f} | {lat.get('p99', float('nan')):.1f} | "
                     f"{'yes' if report.sustained else 'no'} | {neck} |")
        log.info("%d streams: %.1f FPS, %d dropped, p99 %.1f ms", n, report.fps, report.dropped, lat.get("p99", 0))
        failures = 0 if report.sustained else failures + 1
        if failures >= 2:
            break  # two unsustained points in a row: the bound is found
    sustained = [r for r in reports if r.sustained]
    first_fail = next((r for r in reports if not r.sustained), None)
    lines.append("")
    if sustained:
        top = max(sustained, key=lambda r: r.sources)
        lines.append(f"- **{top.sources} concurrent {top.frame_size} streams at {args.fps:g} FPS** sustained "
                     f"(no dropped frame, p99 {top.latency_ms.get('p99', 0):.1f} ms < {LATENCY_BUDGET_MS:g} ms).")
    else:
        lines.append(f"- not even one {args.fps:g} FPS stream is sustained here.")
    if first_fail is not None:
        bound = first_fail.bottleneck
        lines.append(f"- at {first_fail.sources} streams: {first_fail.dropped} dropped, p99 "
                     f"{first_fail.latency_ms.get('p99', 0):.1f} ms; busiest resource "
                     f"{bound[0] + f' ({100 * bound[1]:.0f}% busy)' if bound else '-'}; stage ms/item: "
                     + ", ".join(f"{k} {v:.2f}" for k, v in first_fail.stage_ms.items()) + ".")
    elif sustained and sustained[-1].bottleneck:
        name, busy = sustained[-1].bottleneck
        lines.append(f"- every point sustained; at {sustained[-1].sources} streams the busiest resource, {name}, "
                     f"is {100 * busy:.0f}% busy: it would saturate near {sustained[-1].sources / busy:.0f} streams "
                     "(extend --streams to measure).")
    return lines, reports


def environment(detector: DetectorModel) -> dict[str, Any]:
    env: dict[str, Any] = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
                           "command": " ".join(["python", *sys.argv]), "python": platform.python_version(),
                           "cpus": os.cpu_count(), "backend": detector.backend}
    if detector.device == "cuda":
        import torch

        env["device"] = f"{torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    else:
        env["device"] = f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores, no GPU"
    return env


def _lane_config(model: Path, backend: str, max_batch: int, options: dict[str, Any]) -> Any:
    from streamrt.onnx.model import load_model
    from streamrt.video.model import detector_build_config

    spec = load_model(model).inputs[0]
    return detector_build_config(backend, spec, max_batch=max_batch).replace(backend_options=options)


def load_frames(width: int, height: int, count: int, seed: int) -> list[np.ndarray]:
    clip = SyntheticClip(width=width, height=height, frames=count, seed=seed)
    return [np.ascontiguousarray(f) for f in clip]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--model", type=Path, default=None, help="ONNX or plan (default: the bundled detector)")
    parser.add_argument("--backend", default=None, help="backend for ONNX models (default: best available)")
    parser.add_argument("--size", default="1920x1080", help="frame WxH (default 1920x1080)")
    parser.add_argument("--frames", type=int, default=32, help="distinct frames, cycled (default 32)")
    parser.add_argument("--items", type=int, default=None, help="timed frames per run (default 600 CUDA, 60 CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up frames per run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case (default 5)")
    parser.add_argument("--workers", default=None, help="replicated lane counts (default 2,4 on CUDA, 2 on CPU)")
    parser.add_argument("--streams", default=None, help="camera counts of the sweep, comma separated")
    parser.add_argument("--fps", type=float, default=30.0, help="frames per second per camera (default 30)")
    parser.add_argument("--duration", type=float, default=None, help="seconds per sweep point")
    parser.add_argument("--ring", type=int, default=4, help="slots per lane in the sweep (default 4)")
    parser.add_argument("--pageable-sweep", action="store_true",
                        help="sweep with frames in pageable memory (default on CUDA: pinned, as from a decoder)")
    parser.add_argument("--max-batch", type=int, default=None, help="dynamic batch profile (default 16 CPU, 128 CUDA)")
    parser.add_argument("--skip", choices=("throughput", "sweep"), action="append", default=[], help="skip a part")
    parser.add_argument("--out", type=Path, default=None, help="write detection.md/.json and timelines here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    cuda = args.device == "cuda" or (args.device == "auto" and cuda_available())
    kind = "cuda" if cuda else "cpu"
    defaults = DEFAULTS[kind]
    backend = args.backend or (None if cuda else "onnxruntime")
    max_batch = args.max_batch or (128 if cuda else 16)
    detectors = {"default": open_detector(args.model or bundled_model(), backend=backend, max_batch=max_batch,
                                          labels=None if args.model else bundled_labels())}
    detector = detectors["default"]
    options = LANE_OPTIONS.get(detector.backend, {}) if not cuda else {}
    detectors["lane"] = detector if not options else open_detector(
        args.model or bundled_model(), labels=None if args.model else bundled_labels(),
        config=_lane_config(args.model or bundled_model(), detector.backend, max_batch, options))
    width, height = (int(v) for v in args.size.lower().split("x"))
    frames = load_frames(width, height, args.frames, seed=1)
    env = environment(detector)
    started = time.perf_counter()
    report = ["# Real-time detection benchmark", "", *(f"- {k}: {v}" for k, v in env.items()),
              f"- model: {detector.source} ({detector.layout.name}, {detector.num_classes} classes, input "
              f"{detector.input_hw[1]}x{detector.input_hw[0]}, batch <= {detector.max_batch}), "
              f"frames {width}x{height} uint8 BGR from host memory, {args.frames} distinct, cycled",
              f"- plans: default = {detector.backend} as built by `streamrt detect`"
              + (f"; lane = the same with backend options {options} (one intra-op thread per session, for "
                 "replicated lanes)" if options else ""), ""]
    data: dict[str, Any] = {"environment": env}
    if "throughput" not in args.skip:
        with realtime_collector():  # as `streamrt detect` runs
            lines, rows = throughput(detectors, frames, args, defaults, args.out)
        title = "## Synchronous loop vs pipeline topologies (frames/s, median of interleaved rounds)"
        report += [title, "", *lines, ""]
        data["throughput"] = rows
    if "sweep" not in args.skip:
        with realtime_collector():
            lines, reports = sweep(detector, frames, args, defaults)
        report += [f"## Camera-paced streams at {args.fps:g} FPS each (sustained: no drop, p99 < "
                   f"{LATENCY_BUDGET_MS:g} ms)", "", *lines, ""]
        data["sweep"] = [r.to_dict() for r in reports]
        if args.out is not None and reports:
            last = next((r for r in reports if not r.sustained), reports[-1])
            write_report_files(last, args.out / "sweep", f"streams-{last.sources}")
    report.append(f"Total benchmark time: {time.perf_counter() - started:.0f} s.")
    text = "\n".join(report) + "\n"
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "detection.md").write_text(text)
        (args.out / "detection.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
