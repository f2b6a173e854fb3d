"""``streamrt pipeline-bench``: one frame workload through the pipeline topologies, side by side.

Cases: (a) the synchronous loop, (b) one stream per stage, (c) replicated single-stream workers,
(b+c) replicated stage-per-stream workers; on CUDA each also with CUDA graphs. Frames are uint8
HWC from pageable host memory; pre-processing, the engine (the bundled CNN, or ``--plan``) and
top-k post-processing run on the device. Prints a table; ``-o DIR`` also writes a markdown
report, JSON, Chrome traces (open in https://ui.perfetto.dev) and PNG timelines. See
``docs/streams.md`` for how to read them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from streamrt.cli.args import DEVICE_OPTION, GRAPHS_OPTION, DeprecatedAlias, add_alias, add_frame_size, plain_text
from streamrt.profiling.provenance import git_commit

__all__ = ["add_arguments", "main", "register", "run"]

log = logging.getLogger(__name__)

# Defaults per device: the GPU runs the 1080p -> 640 workload; the 2-core CPU runs the same
# frames into a smaller model input so a full comparison takes tens of seconds.
_DEFAULTS = {
    "cuda": {"size": 640, "items": 600, "warmup": 50, "trace_items": 200},
    "cpu": {"size": 320, "items": 40, "warmup": 4, "trace_items": 24},
}


# pipeline-bench's old --graphs values and the flag that says each now.
_GRAPHS_SPELLING = {"off": "--no-graphs", "on": "--graphs", "both": "--compare-graphs"}


class GraphsMode(argparse.Action):
    """``--graphs`` / ``--no-graphs`` (every command's spelling) and ``--compare-graphs``, into one mode.

    The mode is ``on``, ``off`` or ``both`` (every case without and with graphs, side by side: the
    default). The old ``--graphs off|on|both`` still works and prints one deprecation note.
    """

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string == "--no-graphs":
            mode = "off"
        elif option_string == "--compare-graphs":
            mode = "both"
        elif values is None:
            mode = "on"
        elif values in _GRAPHS_SPELLING:
            mode = values
            new = _GRAPHS_SPELLING[values]
            print(f"{parser.prog}: note: --graphs {values} is deprecated; use {new}", file=sys.stderr)
        else:
            parser.error(f"argument --graphs: takes no value (or the old off, on, both), got {values!r}")
        setattr(namespace, self.dest, mode)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows ``--graphs`` without a value: its optional value is only the deprecated old form."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        return ", ".join(action.option_strings) if isinstance(action, GraphsMode) else \
            super()._format_action_invocation(action)

    def _format_usage(self, usage: str | None, actions: Any, groups: Any, prefix: str | None) -> str:
        return super()._format_usage(usage, actions, groups, prefix).replace("[--graphs ]", "[--graphs]")


def _add_graphs(parser: argparse.ArgumentParser) -> None:
    flag = GRAPHS_OPTION.flags[0]
    parser.add_argument(flag, dest="graphs", action=GraphsMode, nargs="?", default="both", metavar="",
                        help="only with CUDA graphs (CUDA only)")
    parser.add_argument(f"--no-{flag[2:]}", dest="graphs", action=GraphsMode, nargs=0, help="only without them")
    parser.add_argument("--compare-graphs", dest="graphs", action=GraphsMode, nargs=0,
                        help="every case without and with CUDA graphs, side by side (the default; CUDA only)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the benchmark (shared by the subcommand and the standalone scripts)."""
    parser.add_argument(*DEVICE_OPTION.flags, default="auto", help=DEVICE_OPTION.help, **DEVICE_OPTION.kwargs)
    parser.add_argument("--items", type=int, help="timed items per run (default 600 on CUDA, 40 on CPU)")
    warmup = parser.add_argument("--warmup-items", type=int, metavar="N",
                                 help="warm-up items per run (default 50 on CUDA, 4 on CPU)")
    add_alias(parser, "--warmup", warmup, note=True)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs per case; the median is reported")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="rounds of all cases run first, discarded")
    parser.add_argument("--trace-items", type=int, help="items in the extra traced run per case (0: none)")
    distinct = parser.add_argument("--distinct-frames", type=int, default=16, metavar="N",
                                   help="distinct random frames, cycled through the items (default 16)")
    add_alias(parser, "--frames", distinct)  # --frames is a clip's length in demo
    add_frame_size(parser, "1920x1080")
    for old in ("--height", "--width"):  # the old spelling of --frame-size, one dimension each
        parser.add_argument(old, dest=f"old_{old[2:]}", type=int, default=None, help=argparse.SUPPRESS,
                            action=DeprecatedAlias, new="--frame-size WxH")
    parser.add_argument("--size", type=int, help="model input size (default 640 on CUDA, 320 on CPU)")
    parser.add_argument("--classes", type=int, default=1000, help="outputs of the bundled CNN (default 1000)")
    parser.add_argument("--ring", type=int, default=4, help="slots per worker (default 4)")
    parser.add_argument("--workers", default="2,4", metavar="N[,M...]",
                        help="replicated lanes; the worker counts to compare, comma separated (default 2,4)")
    _add_graphs(parser)
    parser.add_argument("--plan", type=Path, help="run this plan (streamrt.load) instead of the bundled CNN")
    parser.add_argument("--torch-threads", type=int, help="torch intra-op threads (CPU runs)")
    parser.add_argument("--verify", type=int, default=16, help="compare the first N outputs of every case (0: off)")
    parser.add_argument("--seed", type=int, default=0, help="seed of frames and weights")
    output = parser.add_argument("-o", "--output", type=Path, metavar="DIR",
                                 help="write pipeline_bench.md/.json, traces/ and timelines/ here")
    add_alias(parser, "--out", output)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "pipeline-bench",
        help="compare pipeline topologies (sync, stage-per-stream, replicated workers) on a frame workload",
        description=plain_text(__doc__),
        formatter_class=_HelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def _environment(kind: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if kind == "cuda":
        env["device"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    else:
        env["device"] = f"CPU ({platform.processor() or platform.machine()}), host streams"
    return env


def _engine(args: argparse.Namespace, spec: Any, device: Any) -> Any:
    import torch

    from streamrt.testing.workloads import TorchModuleEngine, tiny_cnn

    if args.plan is not None:
        import streamrt

        return streamrt.load(args.plan)
    dtype = torch.float16 if device.is_cuda else torch.float32
    return TorchModuleEngine(tiny_cnn(spec, seed=args.seed), device=device.torch_device, dtype=dtype)


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def _analysis(results: Sequence[Any], summaries: Sequence[tuple[Any, Any]], rounds: Sequence[Any],
              device: str) -> list[str]:
    """Plain-language lines under the table: noise, best case, its bound, what graphs changed."""
    from streamrt.measure.rounds import format_ratio, noise_warning

    best = max(range(len(results)), key=lambda i: results[i].items_per_s)
    vs = format_ratio(rounds[best], rounds[0])
    lines = []
    warning = noise_warning({r.case.label: rr for r, rr in zip(results, rounds, strict=True)}, device)
    if warning:
        lines.append(f"- {warning}")
    versus = (f"{vs} the synchronous baseline {results[0].case.label}" if vs.endswith("x") else
              f"no ratio: the synchronous baseline {results[0].case.label} was unstable across rounds")
    lines.append(f"- best: **{results[best].case.label}**, {results[best].items_per_s:.1f} items/s "
                 f"({rounds[best].describe('items/s')}), {versus}.")
    traced = summaries[best][1]
    if traced is not None and traced.bottleneck is not None:
        name, busy = traced.bottleneck
        bound = traced.bound_items_per_s
        lines.append(f"- in its traced run ({traced.items_per_s:.1f} items/s) the busiest resource is **{name}**, "
                     f"busy {100 * busy:.0f}% of the time: that run is within {100 * (1 - busy):.0f}% of the "
                     f"bound this resource sets ({bound:.1f} items/s).")
    for _timed, tr in summaries:
        if tr is not None and tr.enqueue_ms_per_item is not None:
            lines.append(f"- {tr.label}: host enqueue {tr.enqueue_ms_per_item:.3f} ms/item; busiest "
                         f"{tr.bottleneck[0] if tr.bottleneck else '-'}.")
    return lines


def _stage_table(summaries: Sequence[tuple[Any, Any]]) -> list[str]:
    rows = [tr for _, tr in summaries if tr is not None and tr.stage_ms]
    if not rows:
        return []
    stages = list(rows[0].stage_ms)
    out = ["| config (traced) | " + " | ".join(f"{s} ms" for s in stages) + " | enqueue ms/item |",
           "|---|" + "---:|" * (len(stages) + 1)]
    for tr in rows:
        cells = [f"{tr.stage_ms.get(s, float('nan')):.3f}" for s in stages]
        enq = "-" if tr.enqueue_ms_per_item is None else f"{tr.enqueue_ms_per_item:.3f}"
        out.append(f"| {tr.label} | " + " | ".join(cells) + f" | {enq} |")
    return out


def run(args: argparse.Namespace) -> int:
    from streamrt._optional import require

    # The workload (frames, resize, the bundled CNN, top-k) is torch code on either device.
    torch = require("torch", extra="torch", purpose="pipeline-bench's frame workload, on the CPU too")

    from streamrt.device import get_device
    from streamrt.measure.rounds import Rounds
    from streamrt.pipeline.bench import compare, standard_cases
    from streamrt.profiling.pipeline_summary import format_comparison, summarize
    from streamrt.testing.workloads import FrameSpec, FrameWorkload, make_frames

    if args.output is not None:
        from streamrt.cli.common import check_output

        check_output(args.output, directory=True)
    device = get_device(args.device)
    defaults = _DEFAULTS[device.kind]
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    width, height = args.frame_size or (args.old_width or 1920, args.old_height or 1080)
    spec = FrameSpec(height=height, width=width, size=args.size or defaults["size"], classes=args.classes)
    engine = _engine(args, spec, device)
    frames = make_frames(args.distinct_frames, spec, seed=args.seed)
    graphs = {"off": [False], "on": [True], "both": [False, True]}[args.graphs] if device.is_cuda else [False]
    workers = [int(w) for w in str(args.workers).split(",") if w.strip()]
    cases = standard_cases(ring_size=args.ring, workers=workers, graphs=graphs)
    trace_items = defaults["trace_items"] if args.trace_items is None else args.trace_items
    log.info("pipeline-bench on %s: %d cases x %d rounds, %dx%d frames -> %d", device.kind, len(cases), args.rounds,
             spec.height, spec.width, spec.size)
    results = compare(
        cases, lambda: FrameWorkload(engine, spec), device, frames,
        items=args.items or defaults["items"], warmup=args.warmup_items or defaults["warmup"], rounds=args.rounds,
        warmup_rounds=args.warmup_rounds,
        trace_items=trace_items or None, keep_outputs=args.verify,
    )
    summaries = [(summarize(r.median), summarize(r.traced) if r.traced is not None else None) for r in results]
    rounds = [Rounds.of(t.items_per_s for t in r.rounds) for r in results]
    lines = [format_comparison(summaries, rounds=rounds), "", *_analysis(results, summaries, rounds, device.kind)]
    if args.verify:
        reference = results[0].outputs
        same = [r.case.label for r in results[1:] if not all(a.equal(b) for a, b in zip(reference, r.outputs,
                                                                                            strict=True))]
        lines.append(f"- outputs of the first {len(reference)} items: "
                     + ("bit-identical in every case." if not same else f"DIFFER in {', '.join(same)}."))
    env = _environment(device.kind)
    print(f"\npipeline-bench: {env['device']}, {spec.height}x{spec.width} uint8 frames -> {spec.size}x{spec.size}, "
          f"{args.items or defaults['items']} items x {args.rounds} rounds, commit {env['commit']}\n")
    print("\n".join(lines))
    if args.output is not None:
        _write(args.output, env, spec, lines, results, summaries)
        print(f"\nwrote {args.output}/pipeline_bench.md, .json, traces/ and timelines/")
    return 0


def _write(out: Path, env: dict[str, Any], spec: Any, lines: list[str], results: Sequence[Any],
           summaries: Sequence[tuple[Any, Any]]) -> None:
    from streamrt.errors import MissingDependencyError
    from streamrt.profiling.timeline import plot_timeline
    from streamrt.profiling.trace import write_chrome_trace

    out.mkdir(parents=True, exist_ok=True)
    plots = True
    for result in results:
        if result.traced is not None and result.traced.spans:
            slug = _slug(result.case.label)
            write_chrome_trace(result.traced, out / "traces" / f"{slug}.json")
            try:
                if plots:
                    plot_timeline(result.traced, out / "timelines" / f"{slug}.png")
            except MissingDependencyError as exc:  # keep the measurements of a long run
                log.warning("no PNG timelines: %s", exc)
                plots = False
    facts = "\n".join(f"- {k}: {v}" for k, v in env.items())
    report = [
        "# Pipeline topologies benchmark", "", facts,
        f"- workload: {spec.height}x{spec.width} uint8 frames (pageable host memory) -> resize {spec.size}x{spec.size} "
        f"+ normalise -> engine -> softmax top-{spec.topk} -> host", "",
        "## Results", "", *lines, "",
        "## Stage times (mean span per item, traced runs)", "", *_stage_table(summaries), "",
        "Timelines: `timelines/<case>.png`; Chrome traces: `traces/<case>.json` (open in https://ui.perfetto.dev).",
    ]
    (out / "pipeline_bench.md").write_text("\n".join(report) + "\n")
    data = {"environment": env, "cases": [
        {"label": r.case.label, "config": r.case.config.to_dict(), "items_per_s": r.items_per_s,
         "rounds_items_per_s": [t.items_per_s for t in r.rounds], "timed": timed.to_dict(),
         "traced": traced.to_dict() if traced is not None else None}
        for r, (timed, traced) in zip(results, summaries, strict=True)]}
    (out / "pipeline_bench.json").write_text(json.dumps(data, indent=2, default=str))


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point (``benchmarks/pipeline_topologies.py``, ``scripts/gpu_pipeline_check.py``)."""
    parser = argparse.ArgumentParser(prog="pipeline-bench", description=plain_text(__doc__),
                                     formatter_class=_HelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    return run(args)
