"""GPU video check: decode included. NVDEC alone, camera-paced streams decoded by NVDEC, GPU vs CPU
decode vs raw frames on one detector, and streams vs the synchronous loop with fair baselines.

One call on the GPU machine, under ``--budget`` seconds (default 450: parts that would not fit are
skipped and say so). Clips come from ``scripts/make_video_clips.py`` (run on the CPU machine,
carried over); PyNvVideoCodec from its wheel. Writes ``OUT/gpu_video_check.md`` and ``.json``
with date, commit (``$STREAMRT_COMMIT``), device and command.

1. NVDEC alone: N sessions (clips cycled, looped), one thread each, frames/s for N in ``--decoders``.
2. Decode-included camera-paced sweep: N cameras at 30 FPS, each an NVDEC session, through the
   pipeline (streams + CUDA graphs, NV12 fused pre-processing); sustained = no drop and p99 < 100 ms;
   binding resource: NVDEC (decoder utilisation >= 90%, or frames/s within 10% of part 1's bound)
   else the pipeline trace's busiest resource. The cameras are live streams (``DetectConfig(live=True)``:
   each on its own thread behind a drop-oldest queue, served round-robin, so overload drops frames
   evenly with bounded latency, not the lock-step tick's collapse), admitted from measured capacity
   (``--admission``: ``off`` runs all and says how many fit; ``refuse``/``queue`` hold back the rest).
3. GPU decode vs CPU decode vs raw frames: same detector, same clips, same stream count, free-running.
4. Fair baselines: benchmarks/detection.py part 1 (sync and pipelines, with and without graphs on both sides).
5. Hybrid decode at the first stream count NVDEC alone did not sustain: streams spill to CPU decoders.
6. The gpu-marked tests of decoding and the NV12 kernel (tests/video/test_nvdec.py, test_decode_processes.py,
   NV12 kernel in test_gpu_ops.py).

Every part (and every row of parts 1-3) catches its own failure, records it and goes on: a decoder that
cannot open (``cuvidCreateDecoder`` out of memory at 150 sessions) costs its row, not the rest of the call.

``--device cpu --quick`` runs every part on the CPU in seconds, a CPU decoder (:class:`CpuPool`, OpenCV)
standing in for NVDEC and two tiny generated clips when ``--clips`` has none: the smoke run of
``tests/video/test_gpu_video_check.py``, so a crash in the script is found before a GPU call.

Usage::

    python scripts/make_video_clips.py build/video-clips                  # CPU machine
    pip install .whl/pynvvideocodec-*.whl                                 # GPU machine
    python scripts/gpu_video_check.py OUT --clips build/video-clips
    python scripts/gpu_video_check.py OUT --device cpu --quick            # the CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from streamrt.pipeline.collector import realtime_collector
from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.profiling.gc_pauses import GcPauses
from streamrt.video import ArraySource, DetectConfig, Prefetch, SourceInfo, VideoFileSource, run_detection
from streamrt.video.admission import ADMISSION_MODES, Admission, AdmissionConfig, plan_admission
from streamrt.video.clips import smoke_clips as _smoke_clips
from streamrt.video.decode_nvdec import NvdecOptions, NvdecPool, measure_nvdec, nvdec_available
from streamrt.video.decode_scaling import DecoderLoad
from streamrt.video.hybrid_policy import DEFAULT_HEADROOM
from streamrt.video.model import DetectorModel, bundled_labels, bundled_model, open_detector
from streamrt.video.report import LATENCY_BUDGET_MS, RunReport

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu_parts import Budget

ROOT = Path(__file__).resolve().parents[1]
FPS = 30.0
# How NVDEC sessions are made (scripts/gpu_nvdec_scaling.py compares them): the old way, and the fix.
NVDEC_WAYS = {"legacy": NvdecOptions(context="own", reuse=False), "primary+reuse": NvdecOptions()}


class _LoopedFile:
    """A video file decoded by OpenCV, started over at its end (the CPU stand-in of a looping NVDEC session)."""

    def __init__(self, path: Path, loop: bool) -> None:
        self.path, self.loop = path, loop
        self.source = VideoFileSource(path)

    @property
    def info(self) -> SourceInfo:
        return self.source.info

    def read(self) -> Any:
        frame = self.source.read()
        if frame is None and self.loop:
            self.source.close()
            self.source = VideoFileSource(self.path)
            frame = self.source.read()
        return frame

    def skip(self, count: int) -> int:
        return sum(self.read() is not None for _ in range(count))

    def close(self) -> None:
        self.source.close()


class CpuPool:
    """NvdecPool's interface over CPU decoders (``--device cpu``): one prefetching OpenCV decoder per path,
    BGR frames in host memory (a CPU engine takes no NV12)."""

    def __init__(self, paths: list[Path], *, workers: int = 1, depth: int = 4, loop: bool = False) -> None:
        self._sources = [Prefetch(_LoopedFile(Path(p), loop), depth=depth) for p in paths]

    def sources(self) -> list[Any]:
        return list(self._sources)

    def close(self) -> None:
        for source in self._sources:
            source.close()

    def __enter__(self) -> CpuPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measure_cpu(paths: list[Path], decoders: int, seconds: float = 3.0) -> dict[str, float]:
    """measure_nvdec's numbers for CPU decoders (``--device cpu``)."""
    with CpuPool([paths[i % len(paths)] for i in range(decoders)], loop=True) as pool:
        sources = pool.sources()
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            done += sum(s.read() is not None for s in sources)
        wall = time.perf_counter() - started
    return {"decoders": decoders, "fps": done / wall, "fps_per_decoder": done / wall / decoders}


class Decoders:
    """The decoder the parts use: NVDEC on the GPU, :class:`CpuPool` standing in for it on the CPU."""

    def __init__(self, device: str, quick: bool, nvdec: str = "primary+reuse", processes: int = 0) -> None:
        self.device, self.quick, self.processes = device, quick, processes
        self.cuda = device == "cuda"
        self.options = NVDEC_WAYS[nvdec]
        where = f", in {processes} decoder processes (CUDA IPC)" if processes else ""
        self.name = f"NVDEC ({self.options.describe()}{where})" if self.cuda else "CPU stand-in for NVDEC (OpenCV)"

    def pool(self, paths: list[Path], *, workers: int, depth: int = 4, loop: bool = False) -> Any:
        """The decoding pool of a part: NVDEC (threads here, or ``processes`` decoder processes), or the CPU
        stand-in (BGR host frames: a CPU engine takes no NV12, so the processes are NVDEC's only)."""
        if self.cuda and self.processes:
            from streamrt.video.decode_processes import ProcessDecodePool

            return ProcessDecodePool(paths, processes=self.processes, slots=depth, loop=loop, options=self.options)
        if self.cuda:
            return NvdecPool(paths, workers=workers, depth=depth, loop=loop, options=self.options)
        return CpuPool(paths, workers=workers, depth=depth, loop=loop)

    def measure(self, paths: list[Path], n: int, seconds: float) -> dict[str, float]:
        if self.cuda:
            return measure_nvdec(paths, n, seconds=seconds, options=self.options)
        return measure_cpu(paths, n, seconds)


def _error_row(columns: int, label: Any, exc: BaseException, state: dict[str, Any], part: str) -> str:
    """A table row saying this point failed (and the failure recorded), so the part goes on."""
    state.setdefault("failed", []).append(f"{part} {label}: {type(exc).__name__}: {exc}")
    traceback.print_exc()
    text = " ".join(f"{type(exc).__name__}: {exc}".split()).replace("|", "/")[:300]
    return f"| {label} | FAILED: {text} |" + " |" * (columns - 2)


def _lat(report: RunReport, key: str) -> str:
    return f"{report.latency_ms.get(key, float('nan')):.1f}"


def _check_pictures(clip: Path, count: int = 30) -> str:
    """NVDEC's first pictures against the CPU decoder's (PyAV exact, or OpenCV back to NV12)."""
    from streamrt.video.decoding import open_nv12

    ref = open_nv12(clip)
    with NvdecPool([clip], workers=1) as pool:
        (source,) = pool.sources()
        diffs = [float(np.abs(source.read().cpu().numpy().astype(int) - ref.read().astype(int)).mean())
                 for _ in range(count)]
    ref.close()
    return (f"- NVDEC pictures vs the CPU decoder's ({type(ref).__name__}), first {count} frames of {clip.name}: "
            f"mean |difference| {max(diffs):.3f} levels at worst (0: bit-exact; ~1: OpenCV's BGR round trip).")


def part_nvdec(clips: list[Path], decoders: list[int], state: dict[str, Any], dec: Decoders) -> list[str]:
    lines = [_check_pictures(clips[0]) if dec.cuda else f"- decoder: {dec.name}", "",
             "| sessions | frames/s (aggregate) | frames/s per session | 1080p30 streams |", "|---:|---:|---:|---:|"]
    best = 0.0
    for n in decoders:
        try:
            r = dec.measure(clips, n, 0.5 if dec.quick else 3.0)
        except Exception as exc:  # e.g. sessions that cannot open: this row fails, the next count runs
            lines.append(_error_row(4, n, exc, state, "part 1"))
            continue
        best = max(best, r["fps"])
        lines.append(f"| {n} | {r['fps']:.0f} | {r['fps_per_decoder']:.0f} | {r['fps'] / FPS:.0f} |")
        state.setdefault("nvdec", []).append(r)
    state["nvdec_bound_fps"] = best
    lines += ["", f"- NVDEC bound on these clips: **{best:.0f} frames/s = {best / FPS:.0f} streams at 30 FPS** "
                  "(steady state, set-up excluded)."]
    return lines


def _detector(state: dict[str, Any]) -> DetectorModel:
    if "detector" not in state:
        started = time.perf_counter()
        state["detector"] = open_detector(bundled_model(), labels=bundled_labels(),
                                          max_batch=128 if torch.cuda.is_available() else 8)
        state["detector_s"] = time.perf_counter() - started
    detector: DetectorModel = state["detector"]
    return detector


def _admission(detector: DetectorModel, sources: list[Any], batch: int, state: dict[str, Any], mode: str,
               quick: bool, decode: tuple[str, float] | None = None) -> tuple[Admission, int]:
    """Admission from measured capacity: decode = ``decode`` (the decoder's name and frames/s) if given, else part
    1's bound (unbounded when part 1 did not run), engine = a short loop of inferences at the run's batch (measured
    once per batch). Returns the plan and how many fit."""
    from streamrt.video.capacity import CapacityRecord, machine_name, measure_engine, plan_id

    key = f"engine_fps_batch{batch}"
    if key not in state:
        state[key] = measure_engine(detector, batch, seconds=0.2 if quick else 1.0)
    info = sources[0].info
    decoder, decode_fps = decode or ("nvdec" if torch.cuda.is_available() else "cpu",
                                     float(state.get("nvdec_bound_fps") or math.inf))
    record = CapacityRecord("h264", info.width, info.height, decoder, decode_fps, float(state[key]),
                            plan_id(detector), machine_name(), time.time(), batch)
    demand = [FPS] * len(sources)
    fit = len(plan_admission(demand, record, AdmissionConfig("refuse")).admitted)
    return plan_admission(demand, record, AdmissionConfig(mode)), fit


def _paced(detector: DetectorModel, sources: list[Any], seconds: float, state: dict[str, Any] | None = None,
           admission: str = "off", quick: bool = False, reader: str = "auto",
           decode: tuple[str, float] | None = None, queue_depth: int = 2) -> tuple[RunReport, float | None]:
    """Camera-paced live streams (each on its own thread behind a drop-oldest queue, served round-robin:
    under overload every stream drops evenly and latency stays bounded), admitted from measured capacity
    (``decode``: the decoder's name and frames/s, when not part 1's NVDEC bound); ``queue_depth``: frames each
    stream's live queue holds (the CLI's ``--queue-depth``)."""
    live_reader, ahead, switch_ms = READERS[reader]
    calls = -(-len(sources) // detector.max_batch)
    batch = -(-len(sources) // calls)
    config = DetectConfig(pipeline=PipelineConfig(topology=Topology.STREAMS, ring_size=4, trace=True,
                                                  cuda_graphs=True),
                          batch=batch, paced=True, live=True, queue_depth=queue_depth, fps=FPS, live_reader=live_reader,
                          calls_ahead=ahead,
                          max_frames=int(seconds * FPS) + 15, warmup_frames=15)
    plan, fit = _admission(detector, sources, batch, {} if state is None else state, admission, quick, decode)
    print(f"  admission: {plan.message}", flush=True)
    before = sys.getswitchinterval()
    if switch_ms is not None:  # how long a thread that wants the GIL waits for a busy holder to give it up
        sys.setswitchinterval(switch_ms / 1000)
    try:
        with DecoderLoad() as load, GcPauses() as pauses:
            report = run_detection(detector, sources, config, admission=plan)
        if state is not None:  # the part's own line also counts the detector's build and the measurements
            state.setdefault("run_gc", []).append(pauses.summary())
    finally:
        sys.setswitchinterval(before)
    report.admission["fit"] = fit
    return report, load.mean


def _drops(report: RunReport) -> str:
    """Dropped frames per stream that ran, fewest / most (live streams drop evenly under overload)."""
    drops = [int(p.get("dropped", 0)) for p in report.per_source if p.get("state", "ran") == "ran"]
    return f"{min(drops)} / {max(drops)}" if drops else "-"


def _binding(report: RunReport, nvdec_util: float | None, bound: float | None) -> str:
    near_bound = bound is not None and report.fps >= 0.9 * bound
    if (nvdec_util is not None and nvdec_util >= 0.9) or near_bound:
        return f"NVDEC ({100 * nvdec_util:.0f}% busy)" if nvdec_util is not None else "NVDEC (at its bound)"
    neck = report.bottleneck
    return f"{neck[0]} ({100 * neck[1]:.0f}%)" if neck else "-"


# How part 2 reads live streams and fills engine calls (DetectConfig.live_reader, calls_ahead, and the
# interpreter's GIL switch interval in ms, None: Python's 5 ms): the default, and the ways before it, run
# beside it at the counts of --baselines-at. gil0.5: the default reader with a 0.5 ms switch interval (at 185
# streams on 2026-12-02 the consumer's gather took 25 ms per call of one copy launch: GIL waits, not work).
READERS: dict[str, tuple[str, int | None, float | None]] = {
    "auto": ("auto", None, None), "threads": ("threads", None, None), "no-hold": ("auto", 1 << 30, None),
    "before": ("threads", 1 << 30, None), "gil0.5": ("auto", None, 0.5), "gil1": ("auto", None, 1.0)}


def _sweep_points(counts: list[int], baselines_at: list[int], baselines: list[str]) -> list[tuple[int, str]]:
    """(streams, reader) in order: each count with the default reader (``auto``: one thread for a decoder
    pool's streams, part-filled calls held while 2 are in flight) and the ``baselines`` beside it at the
    counts in ``baselines_at``."""
    return [(n, r) for n in counts for r in ["auto", *(baselines if n in baselines_at else [])]]


def part_sweep(clips: list[Path], counts: list[int], seconds: float, workers: int, state: dict[str, Any],
               budget: Budget, dec: Decoders, admission: str = "off", baselines_at: list[int] | None = None,
               baselines: list[str] | None = None) -> list[str]:
    detector = _detector(state)
    bound = state.get("nvdec_bound_fps")
    lines = [f"Detector built in {state['detector_s']:.0f} s ({detector.backend}, batch <= {detector.max_batch}). "
             f"Live streams (DetectConfig(live=True), drop-oldest queues of 2), admission {admission} from measured "
             "capacity (decode: part 1's bound; engine: measured at the run's batch). Reader: `auto` = one thread for "
             "a decoder pool's streams (LiveGroup) and part-filled calls held while 2 are in flight; `threads` = a "
             "LiveStream thread per stream; `no-hold` = no holding; `before` = both, as before 2026-12-02. "
             "frames/call = frames per engine call (a CUDA call runs the full batch however few fill it).", "",
             "| streams | reader | fit (admission) | ran | batch | offered FPS | achieved FPS | frames/call | "
             "dropped | drops per stream min / max | p50 ms | p99 ms | sustained | NVDEC busy | binding resource |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---|"]
    failures = 0
    for n, reader in _sweep_points(counts, baselines_at or [], baselines or []):
        if failures >= 2 and reader == "auto":  # two counts in a row failed: higher ones would too
            break                               # (the baselines beside the last one still run)
        if budget.left < seconds + 40:
            lines.append(f"| {n} | {reader} | | | | | | | | | | | skipped: time budget | | |")
            continue
        try:
            with dec.pool([clips[i % len(clips)] for i in range(n)], workers=workers, depth=4, loop=True) as pool:
                report, util = _paced(detector, list(pool.sources()), seconds, state, admission, dec.quick, reader)
        except Exception as exc:  # 150 sessions that cannot open: this row fails, the sweep goes on
            lines.append(_error_row(14, f"{n} | {reader}", exc, state, "part 2"))
            failures += reader == "auto"
            continue
        state.setdefault("sweep", []).append({**report.to_dict(), "nvdec_util": util, "reader": reader})
        busy = f"{100 * util:.0f}%" if util is not None else "n/a"
        lines.append(f"| {n} | {reader} | {report.admission['fit']} | {report.admission['admitted']} | "
                     f"{report.batch} | {n * FPS:.0f} | {report.fps:.1f} | {report.frames_per_call:.1f} | "
                     f"{report.dropped} | {_drops(report)} | {_lat(report, 'p50')} | {_lat(report, 'p99')} | "
                     f"{'yes' if report.sustained else 'no'} | {busy} | {_binding(report, util, bound)} |")
        print(lines[-1], flush=True)
        if reader != "auto":
            continue  # a baseline beside the default: it does not end the sweep
        failures = 0 if report.sustained else failures + 1
    sustained = [r for r in state.get("sweep", []) if r["sustained"] and r["reader"] == "auto"]
    lines.append("")
    if sustained:
        top = max(sustained, key=lambda r: r["admission"]["admitted"])
        top = {**top, "sources": top["admission"]["admitted"]}  # streams that ran (admission may refuse some)
        lines.append(f"- **{top['sources']} concurrent 1080p30 H.264 streams sustained with NVDEC decode included** "
                     f"(no drop, p99 {top['latency_ms']['p99']:.1f} ms < {LATENCY_BUDGET_MS:g} ms); target >= 150: "
                     f"{'met' if top['sources'] >= 150 else 'NOT met'}.")
        if bound:
            lines.append(f"- vs the NVDEC bound alone ({bound / FPS:.0f} streams): {top['sources'] * FPS / bound:.0%} "
                         "(goal: within 10%).")
    return lines


def _cpu_sources(clips: list[Path], n: int, nv12: bool = True) -> tuple[list[Any], str]:
    """CPU decoders: PyAV NV12 when installed and ``nv12`` (a CUDA engine converts it), else OpenCV BGR."""
    try:
        if not nv12:
            raise ImportError("BGR asked for: a CPU engine takes no NV12")
        import av  # noqa: F401

        from streamrt.video.decode_av import AvSource

        return [Prefetch(AvSource(clips[i % len(clips)], threads=1, output="nv12"), depth=4) for i in range(n)], \
            "PyAV NV12, 1 thread per stream"
    except ImportError:
        return [Prefetch(VideoFileSource(clips[i % len(clips)]), depth=4) for i in range(n)], \
            "OpenCV (FFmpeg) BGR, 1 thread per stream"


def _raw_sources(clips: list[Path], n: int, frames: int) -> list[Any]:
    decoded = []
    for clip in clips:
        src = VideoFileSource(clip)
        pictures = [torch.from_numpy(src.read()) for _ in range(64 if torch.cuda.is_available() else 8)]
        decoded.append([(p.pin_memory() if torch.cuda.is_available() else p).numpy() for p in pictures])
        src.close()
    return [ArraySource(decoded[i % len(decoded)], loop=True, length=frames, name=f"raw{i}") for i in range(n)]


def part_paths(clips: list[Path], n: int, frames: int, state: dict[str, Any], dec: Decoders) -> list[str]:
    detector = _detector(state)
    config = DetectConfig(pipeline=PipelineConfig(topology=Topology.STREAMS, ring_size=4, trace=True,
                                                  cuda_graphs=True), batch=min(n, detector.max_batch),
                          max_frames=frames, warmup_frames=10)
    lines = [f"{n} streams of the same clips, free-running ({frames} frames each), same detector, streams + graphs:",
             "",
             "| path | frames/s | = 30 FPS streams | p50 ms | p99 ms | busiest resource (trace) |",
             "|---|---:|---:|---:|---:|---|"]
    paths = [clips[i % len(clips)] for i in range(n)]

    def gpu_decode(opened: list[Any]) -> list[Any]:
        opened.append(dec.pool(paths, workers=8, depth=4, loop=True))
        return list(opened[-1].sources())

    def cpu_decode(opened: list[Any]) -> list[Any]:
        opened.extend(_cpu_sources(clips, n, dec.cuda)[0])
        return list(opened)

    runs: list[tuple[str, Callable[[list[Any]], list[Any]]]] = [
        (f"GPU decode ({dec.name}{', NV12 on the device' if dec.cuda else ''})", gpu_decode),
        (f"CPU decode ({_cpu_sources(clips, 0, dec.cuda)[1]})", cpu_decode),
        ("raw frames (pre-decoded, pinned host memory)", lambda opened: _raw_sources(clips, n, frames + 10)),
    ]
    for label, make in runs:
        opened: list[Any] = []  # what this path opened, closed whatever happens (nothing, if opening failed)
        try:
            report = run_detection(detector, make(opened), config)
        except Exception as exc:  # this path fails alone: the next path runs
            lines.append(_error_row(6, label, exc, state, "part 3"))
            continue
        finally:
            for thing in opened:
                try:
                    thing.close()
                except Exception:
                    traceback.print_exc()
        neck = f"{report.bottleneck[0]} ({100 * report.bottleneck[1]:.0f}%)" if report.bottleneck else "-"
        lines.append(f"| {label} | {report.fps:.1f} | {report.fps / FPS:.0f} | {_lat(report, 'p50')} | "
                     f"{_lat(report, 'p99')} | {neck} |")
        state.setdefault("paths", []).append({"path": label, **report.to_dict()})
        print(lines[-1], flush=True)
    return lines


def part_fair_runners(state: dict[str, Any], out: Path, dec: Decoders, runners: list[str]) -> list[str]:
    """Part 4 once per AOTInductor runner (``STREAMRT_AOTI_RUNNER``: ``torch`` holds the GIL while the
    engine runs, ``nogil`` gives it up), one after the other in this process, the same detector."""
    from streamrt.backends.torch_inductor.nogil_runner import RUNNER_ENV

    if not runners:
        return part_fair(state, out, dec)
    lines: list[str] = []
    before = os.environ.get(RUNNER_ENV)
    try:
        for runner in runners:
            os.environ[RUNNER_ENV] = runner
            lines += ["", f"### AOTInductor runner: {runner}", ""]
            try:
                lines += part_fair(state, out / runner, dec, key=f"fair_{runner}")
            except Exception as exc:  # this runner fails alone: the next one runs
                lines.append(_error_row(1, runner, exc, state, "part 4"))
    finally:
        if before is None:
            os.environ.pop(RUNNER_ENV, None)
        else:
            os.environ[RUNNER_ENV] = before
    return lines


def part_fair(state: dict[str, Any], out: Path, dec: Decoders, key: str = "fair") -> list[str]:
    spec_path = ROOT / "scripts" / "gpu_detection_check.py"
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_detection_check", spec_path)
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_detection_check"] = check
    spec.loader.exec_module(check)
    bench = check._load_benchmark()
    detector = _detector(state)
    frames = bench.load_frames(320, 180, 4, seed=1) if dec.quick else bench.load_frames(1920, 1080, 32, seed=1)
    args = SimpleNamespace(workers="2", items=12 if dec.quick else 300, warmup=2 if dec.quick else 50,
                           rounds=1 if dec.quick else 2)
    defaults = dict(bench.DEFAULTS[dec.device], trace_items=6 if dec.quick else 60)
    lines, rows = bench.throughput({"default": detector, "lane": detector}, frames, args, defaults, out / "fair")
    state[key] = rows
    return lines


def part_hybrid(clips: list[Path], seconds: float, state: dict[str, Any], dec: Decoders, headroom: float,
                streams: int | None = None, admission: str = "off",
                starts: tuple[str, ...] = ("staggered",), cpu_decoders: int = 0,
                checkpoint: Callable[[], None] | None = None, cpu_niceness: int | None = None,
                queue_depths: tuple[int, ...] = (2,)) -> list[str]:
    """Part 5: ``streams`` (default: the first count part 2 did not sustain) over NVDEC and CPU decoders.

    The plan's capacities are both sides measured **decoding at once**, the NVDEC side with as many sessions as
    the plan puts there (:func:`~streamrt.video.hybrid_capacity.measure_hybrid_capacity_for_plan`): on 2026-12-03
    each side delivered far less beside the other than alone (NVDEC 3,401 of 5,134 frames/s), and on 2026-12-06
    16 sessions over-stated what 139 paced streams got. With ``admission`` other than
    ``off``, only the streams that fit ``headroom`` of their sum run (the rest are named as queued or refused); the
    policy plans each side to the same share. ``starts``: one run per mode over the same capacity (lockstep: every
    looped clip from frame 0, so all sessions start over at once; staggered, the default: spread over the clip, as
    independent cameras; on an H100 on 2026-12-06 staggered runs dropped nothing and lockstep ones 5-9 frames at the
    restart); ``checkpoint`` saves the state after each run (the call's limit may come before the part's end);
    ``cpu_niceness``: the CPU decoder processes' (None: the hybrid's default,
    :data:`~streamrt.video.hybrid_capacity.CPU_DECODER_NICENESS`); ``queue_depths``: one run per start mode and live
    queue depth (on an H100 on 2026-12-06 every stream dropped 1-8 frames alike at depth 2, the 2-frame queues
    overflowing while the consumer process stalled up to ~70 ms: a deeper queue tells a short stall, whose drops it
    absorbs, from an overload, where it only adds latency).

    The CPU decoders are :func:`~streamrt.video.hybrid.cpu_decoder_processes`: it leaves
    :data:`~streamrt.video.hybrid.CONSUMER_CORES` to the consumer (the thread feeding the engine, the live
    group's and the pools' dispatchers) and one to each NVDEC decoder process, and with
    ``--decode-processes`` the CPU streams run in exactly that many CPU decoder processes. (Without decoder
    processes the CPU streams are threads of the consumer and share its GIL: the plan is then an upper
    bound the run may not reach.)

    On the CPU (``--device cpu``) both sides are decoder processes of the CPU stand-in, the NVDEC side
    planned for one stream, and each stream's first frames are read through the one live group the
    detector would read them with (detecting NV12 needs a CUDA engine).
    """
    from streamrt.video.hybrid import HybridDecode
    from streamrt.video.hybrid_capacity import (
        CONSUMER_CORES,
        CPU_DECODER_NICENESS,
        cpu_decoder_processes,
        measure_cpu_decode,
        measure_cpu_decode_together,
        measure_hybrid_capacity_for_plan,
    )
    from streamrt.video.hybrid_policy import HybridPolicy

    detector = _detector(state)
    nice = CPU_DECODER_NICENESS if cpu_niceness is None else cpu_niceness
    sweep = [r for r in state.get("sweep", []) if r.get("reader", "auto") == "auto"]  # not the baselines
    failed = [r["sources"] for r in sweep if not r["sustained"]]
    n = streams or (min(failed) if failed else (max((r["sources"] for r in sweep), default=150) + 50))
    if dec.quick:
        n = min(n, 3)
    seconds_cpu = 0.5 if dec.quick else 2.0
    cpu_rate = measure_cpu_decode(clips[0], seconds=seconds_cpu)
    cores = len(os.sched_getaffinity(0))
    nvdec_processes = dec.processes if dec.cuda else max(1, dec.processes)
    cpu_cores = cpu_decoders or (1 if dec.quick and not dec.cuda else cpu_decoder_processes(nvdec_processes, cores))
    # the CPU decoder processes' cores all decoding at once, not one decoder x cores (for the report)
    together = measure_cpu_decode_together(clips[0], cpu_cores, seconds=seconds_cpu)
    # the plan's capacities: both sides decoding at once, read as the detector reads them
    # ... with as many NVDEC sessions as the plan from a first measurement puts there (16 over-stated 139 paced
    # streams on an H100 on 2026-12-06)
    both = measure_hybrid_capacity_for_plan(
        clips[0], [FPS] * n, headroom=headroom, first_sessions=1 if dec.quick else 16,
        decode_processes=nvdec_processes, cpu_processes=cpu_cores, seconds=seconds_cpu + 1.0,
        warmup_s=0.3 if dec.quick else 1.0, process_kind="nvdec" if dec.cuda else "cpu", cpu_niceness=nice)
    print(f"  capacity at {both['first']['nvdec_sessions']} NVDEC sessions: {both['first']['nvdec']:.0f} + "
          f"{both['first']['cpu']:.0f} frames/s; the plan's {both['planned_nvdec']} NVDEC streams: measured at "
          f"{both['nvdec_sessions']} sessions, {both['nvdec']:.0f} + {both['cpu']:.0f}", flush=True)
    state["hybrid_capacity"] = both
    capacity = {"nvdec": both["nvdec"], "cpu": both["cpu"]}
    fit = int(headroom * (capacity["nvdec"] + capacity["cpu"]) // FPS)
    ran = n if admission == "off" else max(1, min(n, fit))
    admitted = (f"admission {admission}: {fit} streams fit {headroom:.0%} of the {capacity['nvdec']:.0f} + "
                f"{capacity['cpu']:.0f} frames/s measured at once; " +
                (f"{ran} of {n} ran, {n - ran} {'queued' if admission == 'queue' else 'refused'}" if ran < n
                 else f"all {n} ran"))
    print(f"  {admitted}", flush=True)
    paths = [clips[i % len(clips)] for i in range(ran)]
    if not dec.cuda:
        return [f"- {admitted}", *_hybrid_smoke(paths, {**capacity, "nvdec": 1.5 * FPS}, nvdec_processes, cpu_cores,
                                                state, cpu_niceness=nice)]
    from streamrt.video.decoding import open_nv12

    probe = open_nv12(paths[0])
    clip_frames = probe.info.frames or int(4 * FPS)
    probe.close()
    rows = []
    for mode, depth in [(mode, depth) for mode in starts for depth in queue_depths]:
        # lockstep: every looped clip ends, and every session starts over, at the same moment (the clips of 10 s);
        # staggered: stream i starts at frame i x clip / n, so the files' ends are spread over the clip's length
        first = [i * clip_frames // len(paths) if mode == "staggered" else 0 for i in range(len(paths))]
        label = mode if queue_depths == (2,) else f"{mode}, queue {depth}"
        policy = HybridPolicy(capacity, headroom=headroom)
        with HybridDecode(paths, policy=policy, loop=True, nvdec_workers=8, interval_s=1.0,
                          decode_processes=dec.processes, cpu_processes=cpu_cores, start_frames=first,
                          cpu_niceness=nice) as hybrid:
            planned = dict(hybrid.summary()["assignment"])
            report, util = _paced(detector, list(hybrid.sources()), seconds, state, "off", dec.quick,
                                  decode=("nvdec+cpu", capacity["nvdec"] + capacity["cpu"]), queue_depth=depth)
            report.decode = hybrid.summary()
        run_gc = state.get("run_gc", ["-"])[-1]
        state.setdefault("hybrid_runs", {})[label] = {**report.to_dict(), "nvdec_util": util, "planned": planned,
                                                     "gc_during_run": run_gc, "queue_depth": depth}
        rows.append((label, report, planned, run_gc))
        if checkpoint is not None:
            checkpoint()
        print(f"  starts {label}: {report.fps:.1f} frames/s, {report.dropped} dropped, p99 {_lat(report, 'p99')} ms; "
              f"collections during the run: {run_gc}", flush=True)
    mode, report, planned, _ = rows[0]
    state["hybrid"] = {**state["hybrid_runs"][mode], "asked": n, "fit": fit,
                       "cpu_capacity": {"one_decoder_fps": cpu_rate, "together_fps": together, "decoders": cpu_cores}}
    where = (f"in {cpu_cores} CPU decoder processes" if dec.processes else
             f"on threads of the consumer ({cpu_cores} cores planned; they share its GIL)")
    alone = state.get("nvdec_bound_fps")
    return [f"{n} camera-paced streams at 30 FPS asked (the first NVDEC-only point not sustained, or beyond the "
            f"sweep). Capacities measured before the run, **both sides decoding at once**: NVDEC "
            f"{capacity['nvdec']:.0f} frames/s ({both['nvdec_sessions']} sessions in {dec.processes} processes, the "
            f"plan's count; {both['first']['nvdec']:.0f} with {both['first']['nvdec_sessions']}; alone: "
            f"{f'{alone:.0f}' if alone else 'not measured'}), CPU {capacity['cpu']:.0f} frames/s ({cpu_cores} "
            f"decoders at niceness +{nice}; alone together {together:.0f}, one decoder alone {cpu_rate:.0f}; "
            f"{cores} cores less {CONSUMER_CORES} for the consumer and {dec.processes} for the NVDEC processes); "
            f"CPU streams "
            f"{where}. {admitted}. Clips of {clip_frames} frames, looped; starts: lockstep = every stream at frame "
            f"0 (all files end at once), staggered = spread over the clip.", "",
            "| streams (asked / ran) | starts | on NVDEC / CPU (planned) | on NVDEC / CPU (end) | moves | "
            "achieved FPS | dropped (streams) | p99 / max ms | sustained | binding | collections during the run |",
            "|---|---|---|---|---:|---:|---:|---:|---|---|---|",
            *(hybrid_row(n, ran, *row) for row in rows)]


def hybrid_row(asked: int, ran: int, starts: str, report: RunReport, planned: dict[str, int], gc_line: str) -> str:
    """One row of part 5's table (a run over a HybridDecode: ``report.decode`` is its summary)."""
    pools = report.decode["pools"]
    streams = sum(1 for p in report.per_source if p.get("dropped"))
    return (f"| {asked} / {ran} | {starts} | {planned['nvdec']} / {planned['cpu']} | "
            f"{report.decode['assignment']['nvdec']} / {report.decode['assignment']['cpu']} | "
            f"{report.decode['moves']} | {report.fps:.1f} | {report.dropped} ({streams}) | {_lat(report, 'p99')} / "
            f"{_lat(report, 'max')} | {'yes' if report.sustained else 'no'} | {report.decode['binding']} pool "
            f"(NVDEC {pools['nvdec']['utilisation']}, CPU {pools['cpu']['utilisation']} of planned capacity); "
            f"trace: {report.bottleneck[0] if report.bottleneck else '-'}{_idle_text(report)} | {gc_line} |")


def _idle_text(report: RunReport) -> str:
    """The trace's compute-idle stretches between calls (a stalled consumer idles the GPU while frames wait)."""
    gaps = report.compute_gaps
    if not gaps:
        return ""
    return (f", GPU compute idle {100 * gaps['idle_share']:.0f}%, {gaps['over']:.0f} stretches over "
            f"{gaps['over_ms']:g} ms (longest {gaps['longest_ms']:.0f} ms)")


def _hybrid_smoke(paths: list[Path], capacity: dict[str, float], nvdec_processes: int, cpu_processes: int,
                  state: dict[str, Any], frames: int = 5, cpu_niceness: int = 0) -> list[str]:
    """Part 5 on the CPU: both sides in decoder processes (the CPU stand-in), ``frames`` of every stream read
    by one :class:`~streamrt.video.live_group.LiveGroup`, and the threads the consumer ran meanwhile."""
    import threading

    from streamrt.video.hybrid import HybridDecode
    from streamrt.video.live_group import LiveGroup, shared_lanes

    with HybridDecode(paths, capacity=capacity, loop=True, interval_s=0, decode_processes=nvdec_processes,
                      cpu_processes=cpu_processes, process_kind="cpu", cpu_niceness=cpu_niceness) as hybrid:
        sources = hybrid.sources()
        shared = shared_lanes(sources)
        if shared is None:
            raise RuntimeError("the hybrid's streams do not read as one pool: the live reader would need a thread each")
        group = LiveGroup(shared[0], shared[1], [s.info for s in sources], fps=0, depth=frames,
                          max_frames=[frames] * len(sources))
        for stream in group.streams:
            stream.start()
        for stream in group.streams:
            stream.wait_finished(60)
        threads = sorted({t.name.split(":")[0] for t in threading.enumerate()})
        read = [stream.produced for stream in group.streams]
        group.stop()
        summary = hybrid.summary()
    state["hybrid"] = {"summary": summary, "frames": read, "consumer_threads": threads}
    return [f"{len(paths)} streams (CPU decoders at niceness +{cpu_niceness}) planned from capacities NVDEC "
            f"(stand-in) {capacity['nvdec']:.0f}, CPU {capacity['cpu']:.0f} frames/s: assignment "
            f"{summary['assignment']}, in {nvdec_processes} + "
            f"{cpu_processes} decoder processes; frames read per stream through one live group {read}; consumer "
            f"threads {', '.join(threads)} (detection needs a CUDA engine for NV12)."]


def starts_modes(text: str) -> tuple[str, ...]:
    """``--hybrid-starts``: lockstep and/or staggered, in order."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    if not modes or any(m not in ("lockstep", "staggered") for m in modes):
        raise SystemExit(f"--hybrid-starts takes lockstep and/or staggered, got {text!r}")
    return modes


def queue_depths(text: str) -> tuple[int, ...]:
    """``--queue-depths``: live queue depths of at least one frame, in order."""
    try:
        depths = tuple(int(d) for d in text.split(",") if d.strip())
    except ValueError:
        depths = ()
    if not depths or min(depths) < 1:
        raise SystemExit(f"--queue-depths takes frame counts of at least 1, comma-separated, got {text!r}")
    return depths


def part_tests(budget: Budget, clips_folder: Path, dec: Decoders) -> list[str]:
    run = ["-m", "gpu"] if dec.cuda else ["--collect-only"]  # on the CPU: the tests exist and import
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *run, "tests/video/test_nvdec.py",
           "tests/video/test_decode_processes.py", "tests/ops/test_gpu_ops.py", "-k", "nvdec or nv12 or hybrid"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(30, budget.left - 10),
                              env={**os.environ, "STREAMRT_VIDEO_CLIPS": str(clips_folder)})
        tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
        return [f"`{' '.join(cmd[2:])}` exit {done.returncode}", "", "```", *tail, "```"]
    except subprocess.TimeoutExpired:
        return ["tests stopped at the time budget"]


def build_parser() -> argparse.ArgumentParser:
    """The script's arguments (the runbook's VIDEO_ARGS are checked against it on the CPU)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the smoke run, a CPU decoder standing in for NVDEC")
    parser.add_argument("--quick", action="store_true", help="few, short points (with --device cpu: seconds)")
    parser.add_argument("--clips", type=Path, default=ROOT / "build" / "video-clips")
    parser.add_argument("--decoders", default="1,2,4,8,14")
    parser.add_argument("--streams", default="50,100,150,200")
    parser.add_argument("--duration", type=float, default=4.0, help="measured seconds per sweep point")
    parser.add_argument("--workers", type=int, default=8, help="NVDEC driver threads in the sweep")
    parser.add_argument("--nvdec", choices=tuple(NVDEC_WAYS), default="primary+reuse",
                        help="how NVDEC sessions are made: the primary context with decoders kept (default, "
                             "measured better on the H200), or the old way (legacy)")
    parser.add_argument("--decode-processes", type=int, default=0, metavar="N",
                        help="parts 2, 3 and 5: NVDEC sessions in N decoder processes, pictures handed over by CUDA "
                             "IPC (0: threads in this process)")
    parser.add_argument("--admission", choices=ADMISSION_MODES, default="off",
                        help="part 2: refuse or queue the streams that do not fit the measured capacity, or run all "
                             "(off: the overload behaviour, every stream dropping evenly)")
    parser.add_argument("--baselines-at", default="", metavar="N,..",
                        help="stream counts of part 2 also run with the --baselines readers beside the default")
    parser.add_argument("--baselines", default="before", metavar="NAME,..",
                        help=f"part 2's other readers: {', '.join(r for r in READERS if r != 'auto')}")
    parser.add_argument("--path-streams", type=int, default=32, help="streams in the GPU/CPU/raw comparison")
    parser.add_argument("--aoti-runners", default="", metavar="NAME,..",
                        help="part 4 once per AOTInductor runner: torch (holds the GIL while the engine runs), "
                             "nogil (gives it up; the default runner); empty: once, with the default")
    parser.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                        help=f"part 5: the share of each side's measured capacity the hybrid plans and admits up to "
                             f"(default {DEFAULT_HEADROOM}, `streamrt detect --hybrid`'s)")
    parser.add_argument("--hybrid-starts", default="staggered", metavar="MODE,..",
                        help="part 5, one run per mode with the same capacity: staggered (the default: stream i "
                             "starts at frame i x clip / n, so the looped files end at different moments, as "
                             "independent cameras do) and/or lockstep (every stream at frame 0: all files end and "
                             "restart at once, a burst of reopened decoders no camera fleet has)")
    parser.add_argument("--queue-depths", default="2", metavar="N,..",
                        help="part 5: one run per start mode and depth of each stream's live queue (frames; the "
                             "CLI's --queue-depth, default 2): a deeper queue absorbs a short stall of the consumer "
                             "and adds latency under overload")
    parser.add_argument("--cpu-decoders", type=int, default=0, metavar="N",
                        help="part 5: CPU decoder processes (0: the cores less 2 for the consumer and one per NVDEC "
                             "process)")
    parser.add_argument("--cpu-niceness", type=int, default=None, metavar="N",
                        help="part 5: added to the CPU decoder processes' niceness (0-19), so they yield contended "
                             "cores to the NVDEC processes and the consumer; default: the hybrid's (0)")
    parser.add_argument("--hybrid-streams", type=int, default=None, metavar="N",
                        help="part 5's stream count (default: the first count part 2 did not sustain)")
    parser.add_argument("--nvdec-bound", type=float, default=None, metavar="FPS",
                        help="NVDEC's bound on these clips, measured elsewhere (scripts/gpu_nvdec_scaling.py with "
                             "decoder processes), for admission and the hybrid plan when part 1 does not run")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for the whole check")
    parser.add_argument("--parts", default="1,2,3,4,6,5", help="in this order; parts that do not fit are skipped")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # parsed once, before any part runs: a bad list fails here, not at part 5
    starts, depths = starts_modes(args.hybrid_starts), queue_depths(args.queue_depths)
    budget = Budget(args.budget)
    dec = Decoders(args.device, args.quick, args.nvdec, args.decode_processes)
    if dec.cuda and (not torch.cuda.is_available() or not nvdec_available()):
        print("needs a CUDA GPU and PyNvVideoCodec (pip install the pynvvideocodec wheel); "
              "--device cpu --quick is the CPU smoke run", file=sys.stderr)
        return 2
    if args.quick:
        args.decoders, args.streams, args.duration, args.path_streams, args.baselines_at = "1,2", "2,3", 1.0, 2, "2"
    clips = sorted(args.clips.glob("*.mp4"))
    if not clips and not dec.cuda:
        clips = _smoke_clips(args.out / "clips")
    if not clips:
        print(f"no clips in {args.clips}: run scripts/make_video_clips.py on the CPU machine", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    from streamrt.profiling.provenance import git_commit

    env = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "commit": os.environ.get("STREAMRT_COMMIT") or git_commit(),
           "device": f"{torch.cuda.get_device_name() if dec.cuda else 'CPU'} (torch {torch.__version__}, CUDA "
                     f"{torch.version.cuda}), {os.cpu_count()} cores; decoder {dec.name}",
           "command": " ".join(["python", *(sys.argv if argv is None else ["gpu_video_check.py", *argv])]),
           "python": platform.python_version(),
           "clips": ", ".join(f"{c.name} ({c.stat().st_size / 1e6:.1f} MB)" for c in clips)}
    state: dict[str, Any] = {}
    if args.nvdec_bound:  # part 1, if it runs, measures its own (in-process threads)
        state["nvdec_bound_fps"] = args.nvdec_bound
        env["NVDEC bound"] = f"{args.nvdec_bound:.0f} frames/s (given: --nvdec-bound)"
    ints = lambda text: [int(v) for v in text.split(",") if v.strip()]  # noqa: E731
    names = lambda text: [v.strip() for v in text.split(",") if v.strip()]  # noqa: E731
    if unknown_readers := [r for r in names(args.baselines) if r not in READERS]:
        print(f"unknown readers {unknown_readers}; readers are {', '.join(READERS)}", file=sys.stderr)
        return 2

    def save_state() -> None:
        saved = {k: v for k, v in state.items() if k != "detector"}
        (args.out / "gpu_video_check.json").write_text(json.dumps({"environment": env, **saved}, indent=2,
                                                                  default=str) + "\n")

    parts: dict[str, tuple[str, float, Callable[[], list[str]]]] = {
        "1": ("1. NVDEC alone", 30, lambda: part_nvdec(clips, ints(args.decoders), state, dec)),
        "2": ("2. Decode-included camera-paced streams at 30 FPS (NVDEC -> fused NV12 pre -> engine -> NMS)", 120,
              lambda: part_sweep(clips, ints(args.streams), args.duration, args.workers, state, budget, dec,
                                 args.admission, ints(args.baselines_at), names(args.baselines))),
        "3": ("3. GPU decode vs CPU decode vs raw frames (same detector, same clips)", 60,
              lambda: part_paths(clips, args.path_streams, 20 if args.quick else 150, state, dec)),
        "4": ("4. Streams vs the synchronous loop, fair baselines (1080p, frames from host memory)", 90,
              lambda: part_fair_runners(state, args.out, dec, names(args.aoti_runners))),
        "5": ("5. Hybrid decode: NVDEC + CPU decoders past the NVDEC-only capacity", 60,
              lambda: part_hybrid(clips, args.duration, state, dec, args.headroom, args.hybrid_streams,
                                  args.admission, starts, args.cpu_decoders, save_state, args.cpu_niceness,
                                  depths)),
        "6": ("6. GPU tests of decoding and the NV12 kernel", 45, lambda: part_tests(budget, args.clips, dec)),
    }
    if unknown := [k for k in ints(args.parts) if str(k) not in parts]:
        print(f"unknown parts {unknown}; parts are {', '.join(parts)}", file=sys.stderr)
        return 2
    sections = []
    for key in ints(args.parts):
        title, needs, fn = parts[str(key)]
        print(f"\n== {title}", flush=True)
        started = time.perf_counter()
        if budget.left < needs:
            lines = [f"skipped: {budget.left:.0f} s left of the budget, the part needs ~{needs:.0f} s"]
        else:
            # the collector as in `streamrt detect` (what is open frozen, young collections rarer), and its pauses
            # over the part, the part's setup included (a full one stops every thread of the consumer for tens of ms:
            # drops on many streams at once)
            with realtime_collector(), GcPauses() as pauses:
                try:
                    lines = fn()
                except Exception as exc:
                    lines = ["```", traceback.format_exc(), "```"]
                    state.setdefault("failed", []).append(f"{title}: {type(exc).__name__}: {exc}")
            lines.append(f"\n- garbage collector during the part: {pauses.summary()}")
            state.setdefault("gc", {})[key] = pauses.summary()
        lines.append(f"\n({time.perf_counter() - started:.0f} s)")
        print("\n".join(lines), flush=True)
        sections.append("\n".join([f"## {title}", "", *lines, ""]))
        (args.out / "gpu_video_check.md").write_text(
            "\n".join(["# GPU video check (decode included)", "", *(f"- {k}: {v}" for k, v in env.items()), "",
                       *sections]) + "\n")
        save_state()  # after every part: a kill keeps what was done
    print(f"\nwrote {args.out}/gpu_video_check.md")
    return 1 if state.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
