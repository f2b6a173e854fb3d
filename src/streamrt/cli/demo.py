"""``streamrt demo``: the bundled detector on a generated clip, synchronous loop vs pipeline.

Builds (or reuses) a plan of the bundled detector with the best backend available (TensorRT, else
the GPU backend, else ONNX Runtime on the CPU), writes a generated sample video (1080p on a GPU,
720p on the CPU) and runs it through the synchronous loop and through the multi-stream pipeline.
Prints both throughputs and the speed-up; writes the annotated video, the detections (JSON Lines),
both run reports and their PNG timelines to ``-o DIR`` (default out/demo).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamrt.cli.args import PipelineArgs, add_alias, add_frame_size, backend_choices, plain_text
from streamrt.errors import ConfigError

__all__ = ["register", "run"]

_PIPELINE = PipelineArgs()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo", help="the main demo: detection on a generated clip, synchronous loop vs pipeline",
        description=plain_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    output = parser.add_argument("-o", "--output", type=Path, default=Path("out/demo"), metavar="DIR",
                                 help="where outputs go (default out/demo)")
    add_alias(parser, "--out-dir", output)
    size = add_frame_size(parser, "1920x1080 on CUDA, 1280x720 on the CPU")
    add_alias(parser, "--size", size)  # --size is the model input size in pipeline-bench
    parser.add_argument("--frames", type=int, default=None, metavar="N",
                        help="clip length in frames (default 300 on CUDA, 150 on CPU)")
    parser.add_argument("--backend", default=None, choices=backend_choices(),
                        help="backend (default: the best available)")
    # defaults: 1 lane, ring 4 and CUDA graphs on CUDA; a lane per core, ring 2 on the CPU
    _PIPELINE.group.add_to(parser)
    parser.add_argument("--cache-dir", type=Path, default=None, help="build cache (default ~/.cache/streamrt)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from streamrt.cli.common import check_output
    from streamrt.device import cuda_available
    from streamrt.measure.rounds import format_ratio, noise_warning
    from streamrt.video.demo import DemoConfig, default_pipeline, run_demo

    check_output(args.output, directory=True)
    width, height = args.frame_size or (None, None)
    cuda = cuda_available()
    pipeline = _PIPELINE.config(args, default_pipeline(cuda).replace(cuda_graphs=cuda))
    pipeline = pipeline.replace(cuda_graphs=pipeline.cuda_graphs and cuda)  # --graphs on the CPU: nothing to capture
    if pipeline.topology.value == "sync":
        raise ConfigError("demo compares the synchronous loop with a pipeline: --topology must be streams or single")
    config = DemoConfig(out_dir=args.output, width=width, height=height, frames=args.frames, backend=args.backend,
                        pipeline=pipeline, cache_dir=args.cache_dir)
    result = run_demo(config, progress=lambda line: print(f"  · {line}", file=sys.stderr, flush=True))
    sync, piped = result.sync, result.pipeline
    plans = result.plans
    runs_on = (f"both runs on {plans['sync']}" if plans["sync"] == plans["pipeline"] else
               f"synchronous loop on {plans['sync']}, pipeline on {plans['pipeline']}")
    print(f"\nStreamRT demo: the bundled detector on {result.detector.backend} ({result.detector.device}), "
          f"{piped.frames} frames {piped.frame_size}; {runs_on}\n")
    rows = (("synchronous loop", "sync"), (f"pipeline, {piped.label}", "pipeline"))
    width = max(len(label) for label, _ in rows)
    for label, key in rows:
        rep, rounds = (sync, piped)[key == "pipeline"], result.rounds[key]
        print(f"  {label:<{width}}  {rounds.median:8.1f} FPS   ({rounds.describe('FPS')}; "
              f"latency p50 {rep.latency_ms.get('p50', 0):.1f} ms, p99 {rep.latency_ms.get('p99', 0):.1f} ms)")
    if result.speedup is not None:
        speedup = format_ratio(result.rounds["pipeline"], result.rounds["sync"])
        print(f"  {'speed-up':<{width}}  {speedup:>8}    (median over median of the interleaved rounds)")
    else:
        print(f"  {'speed-up':<{width}}  baseline unstable: the synchronous rounds disagree too much to divide by")
    warning = noise_warning({"sync": result.rounds["sync"], "pipeline": result.rounds["pipeline"]},
                            "cuda" if cuda else "cpu", "and rerun (the build is cached)")
    if warning:
        print(f"  {warning}")
    print(f"  same detections in both runs: {'yes' if result.identical else 'NO'}; "
          f"mAP@0.5 vs the clip's ground truth: {result.map50:.3f}")
    if piped.bottleneck:
        print(f"  pipeline bound: {piped.bottleneck[0]} ({100 * piped.bottleneck[1]:.0f}% busy)")
    print()
    for key in ("video", "detections", "plan", "lane plan", "sample"):
        if key != "lane plan" or result.files[key] != result.files["plan"]:
            print(f"  {key:<11} {result.files[key]}")
    for key, path in result.files.items():
        if key.endswith(".png"):
            print(f"  timeline    {path}")
        elif key.endswith("_trace.json"):
            print(f"  trace       {path}   (open in https://ui.perfetto.dev)")
    reports = [p for k, p in result.files.items() if k.endswith((".md", ".json")) and not k.endswith("_trace.json")]
    print(f"  reports     {', '.join(str(p) for p in reports)}")
    print(f"  summary     {result.files['summary']}   (throughputs of every round, speed-up, mAP)")
    return 0
