"""Engine speed: StreamRT plans at optimization levels against eager PyTorch and torch.compile, with the roofline.

Always ends with a table. Every variant (a plan at a level, a torch.compile mode, eager) is built
and timed in its own child process (``engine_speed.py --worker``, :mod:`speed_variants`) with a
deadline; at the deadline the child's whole process group is killed (Inductor's workers
included) and the row says "did not finish in N s" with what it was doing. Each row is appended to
``OUT/engine-speed.jsonl`` the moment it is known and ``OUT/engine-speed.md`` is rewritten, so even a
call killed from outside leaves the table so far; SIGTERM/SIGINT kill the running child, record it
as interrupted, print the table and exit 143.

Variants, side by side on fresh random (non-zero) inputs rotated over 4 sets, timed after
warm-up with CUDA events (host clock on the CPU), median of many runs:

* **L0..L5**: torch_inductor plans built from the module at each ``--levels`` (static shapes at
  the batch; plan inputs in the plan's precision), run through the plan's default context: CUDA
  graphs on the GPU. Level 4/5 builds keep to ``--build-budget-s`` (BuildConfig.build_budget_s).
* **eager**: the module in the same precision (``torch.no_grad``).
* **compile**: ``torch.compile(mode="reduce-overhead")`` on the GPU (default kernels + CUDA graphs:
  the partner of levels 0-3); on the CPU the default mode.
* **max-autotune**: ``torch.compile(mode="max-autotune")``: the partner of levels 4-5.
* **compile-plain** (opt-in): ``torch.compile()`` default mode, no CUDA graphs.
* **L4r/L5r** (``--rebuild``): the level-4/5 plan built again right after the first build into the
  same timing cache: the warm rebuild's build time, its timing-cache hits and whether its package
  was reused from the timing cache's package cache (``timing_cache.package`` in the JSONL, "package reused" in
  the notes).
* **L4w/L5w**: the same rebuild with new weights (each tensor scaled by its own factor, as after retraining):
  the package cache misses, so this is the rebuild that compiles again with every autotuning result answered
  by the timing cache (issue 28's "<= 60 s from the timing cache"; ``L5r`` on 2026-12-05 compiled nothing).

Columns: build seconds (plan: ``build_module``'s wall time with a fresh Inductor cache; torch.compile:
the first three calls), median ms, images/s, ``x eager`` and ``x pair`` (throughput over eager's and
over the paired torch.compile variant's in the same table), the fraction of the precision's dense
tensor-core peak (CUDA), and the relative L2 error of the first output against eager fp32.

Variants: ``L0``..``L5`` are plans at each optimization level as ``streamrt build`` makes them (the level's
own defaults); suffixes pin one option: ``c``/``s``/``i`` the convolution epilogues (cuDNN's, cuDNN's spatial,
Inductor's: ``L5i`` is what a plain ``L5`` meant in the tables up to 2026-12-05), then ``b``/``n`` cuDNN's
benchmark mode on/off, then ``r`` the warm rebuild (``L5cnr``).

Order and lanes: ``--groups`` lists exactly what runs, most important first; ``--lanes 2`` builds two
variants at a time and stops the other lane while one is timed (:mod:`speed_lanes`), so a call of
~500 s holds level 5, its warm rebuild and torch.compile max-autotune together with the cheap rows.

Deadlines: ``--deadline S`` for every variant, ``--deadlines L5=200,max-autotune=240`` per variant;
``--budget S`` bounds the whole call: a child never gets more than what is left, and a variant whose
expected time (measured earlier in the call, else a prior) does not fit is skipped, so the cheap
rows, which run first, always make the table.

Usage:
    python benchmarks/engine_speed.py --out DIR                      # ResNet-50 fp16, batch 32 and 1 (H200)
    python benchmarks/engine_speed.py --out DIR --batches 32 --levels 3,5 --baselines eager,compile,max-autotune \
        --budget 520 --build-budget-s 200 --deadlines eager=90,compile=150,L3=180,L5=270,max-autotune=300
    python benchmarks/engine_speed.py --out DIR --lanes 2 --budget 505 --build-budget-s 420 \
        --groups 'resnet50@32=L5,L5r,eager/2,compile/2,L3/2,max-autotune/2;mobilenet@32=compile,L3;vit@32=compile,L3' \
        --deadlines L5=450,L5r=150,max-autotune=360,L3=200,compile=150,eager=90    # the H200 call of issue 28
    python benchmarks/engine_speed.py --out DIR --device cpu --quick  # tiny CPU smoke run (CI)
    python benchmarks/engine_speed.py --out DIR --groups 'resnet50@32=L5,L5i,L3c' --fresh-first-call
        # each plan also loaded and called once in a new process (load, first and second call in the notes)
    python benchmarks/engine_speed.py --merge A/engine-speed.jsonl B/engine-speed.jsonl --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed_lanes import DONE, REQUEST, GpuGate, next_task
from speed_variants import BASELINES, CANDIDATES, DTYPES, PAIRS, base_variant, level_of
from streamrt.backends.torch_inductor.deadline import child_env, live_children, run_with_deadline
from streamrt.profiling.peaks import peaks_for
from streamrt.profiling.provenance import report_header

ROOT = Path(__file__).resolve().parents[1]
PRIORS_S = {"eager": 20.0, "compile": 60.0, "compile-plain": 40.0, "max-autotune": 280.0, "L0": 90.0, "L1": 90.0,
            "L2": 100.0, "L3": 110.0, "L4": 280.0, "L5": 280.0, "L4r": 90.0, "L5r": 90.0, "L4w": 150.0, "L5w": 150.0}
"""Expected seconds of a child (start, model, build, timing) for a ResNet-50-sized model on an H200, until one
is measured: shared/reference/h200-2026-12-01.md (plan fp16 build 82 s; torch.compile max-autotune 246 s)."""
DEADLINES_S = {"eager": 120.0, "compile": 240.0, "compile-plain": 240.0, "L0": 240.0, "L1": 240.0, "L2": 240.0,
               "L3": 240.0, "L4": 420.0, "L5": 420.0, "L4r": 240.0, "L5r": 240.0, "L4w": 300.0, "L5w": 300.0,
               "max-autotune": 420.0}
"""Default deadline per variant (``--deadline``/``--deadlines`` replace them)."""


def default_for(table: dict[str, float], variant: str, fallback: float) -> float:
    """``table``'s entry for ``variant``: its own, else its base (``L5cnr`` -> ``L5r``), else, for a rebuild at a
    level the table does not name (``L3r``), the level's first build's, else ``fallback``."""
    base = base_variant(variant)
    level = level_of(variant)
    return table.get(variant, table.get(base, table.get(f"L{level}", fallback) if level is not None else fallback))


RESERVE_S = 5.0
"""Seconds of ``--budget`` kept for writing the table after the last child."""


# --- tasks -----------------------------------------------------------------------------------

def is_rebuild(variant: str) -> bool:
    """``L4r``/``L5r`` (and ``L5w``, with new weights): a plan built again into its first build's timing cache."""
    return level_of(variant) is not None and variant[-1] in "rw"


@dataclass(frozen=True)
class Task:
    model: str
    precision: str
    batch: int
    variant: str
    lane: int | None = field(default=None, compare=False)  # pinned to a lane (1..N), else any lane

    @property
    def key(self) -> tuple[str, str, int, str]:
        return self.model, self.precision, self.batch, self.variant

    def waits_for(self) -> tuple[str, str, int, str] | None:
        """The first build a warm rebuild (``L5r``) reuses the timing cache of; ``None`` for others."""
        rebuild = is_rebuild(self.variant)
        return (self.model, self.precision, self.batch, self.variant[:-1]) if rebuild else None

    @property
    def tier(self) -> int:
        if self.variant == "eager":
            return 0
        if self.variant == "max-autotune" or (level_of(self.variant) or 0) >= 4:
            return 2
        return 1

    def row(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "lane"}


def tasks_in_order(models: list[str], precisions: list[str], batches: list[int], variants: list[str]) -> list[Task]:
    """Every (model, precision, batch, variant): one batch's whole comparison before the next batch's,
    and within it eager, then the cheap builds, then the autotuning ones (level >= 4, max-autotune),
    StreamRT before torch.compile within a tier."""
    tasks = [Task(m, p, b, v) for m in models for p in precisions for b in batches for v in variants]
    order = {t: i for i, t in enumerate(tasks)}
    return sorted(tasks, key=lambda t: (order[Task(t.model, t.precision, t.batch, variants[0])], t.tier,
                                        level_of(t.variant) is None, order[t]))


def tasks_of_groups(groups: list[tuple[str, list[int], list[str]]], precisions: list[str]) -> list[Task]:
    """``--groups``: every group's tasks in the order written (group, batch, precision, variant);
    ``V/N`` pins that variant of that group to lane N."""
    tasks = []
    for model, batches, variants in groups:
        for batch in batches:
            for precision in precisions:
                for item in variants:
                    variant, _, lane = item.partition("/")
                    tasks.append(Task(model, precision, batch, variant, int(lane) if lane else None))
    return tasks


def pin_lanes(tasks: list[Task], lanes: int, lane_of: dict[str, int]) -> list[Task]:
    """Each task's lane: a ``--groups`` pin (``V/N``), else ``--lane-of``; with 2+ lanes the autotuning
    variants default to lane 1 (one after the other), the rest run on whichever lane is free."""
    if lanes <= 1:
        return [replace(t, lane=None) for t in tasks]
    return [t if t.lane is not None else replace(t, lane=lane_of.get(t.variant, 1 if t.tier == 2 else None))
            for t in tasks]


# --- the run ---------------------------------------------------------------------------------

class Interrupted(Exception):
    """SIGTERM/SIGINT arrived: the running child is killed and the table written."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


class Results:
    """Rows as they come: appended to ``engine-speed.jsonl`` and the Markdown table rewritten after each."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out, self.meta, self.started = out, meta, time.monotonic()
        self.rows: list[dict[str, Any]] = []
        out.mkdir(parents=True, exist_ok=True)
        self.jsonl = out / "engine-speed.jsonl"
        self.jsonl.write_text(json.dumps({"meta": meta}) + "\n")

    def add(self, row: dict[str, Any]) -> None:
        """Append ``row`` (callers on several lanes hold :class:`Run`'s lock)."""
        self.rows.append(row)
        with self.jsonl.open("a") as f:
            f.write(json.dumps({"row": row}) + "\n")
        self.write()

    def write(self) -> str:
        self.meta["spent_s"] = time.monotonic() - self.started
        text = markdown(self.rows, self.meta)
        (self.out / "engine-speed.md").write_text(text)
        return text


def _child_row(task: Task, spec_dir: Path, args: argparse.Namespace, deadline: float, lane: int,
               gate: GpuGate) -> dict[str, Any]:
    """Run one variant in a child with ``deadline`` (its timed runs behind ``gate``); its row, or what became of it."""
    name = f"{task.model}-{task.precision}-b{task.batch}-{task.variant}"
    go = spec_dir / "gates" / f"{name}.go"
    go.parent.mkdir(exist_ok=True)
    go.unlink(missing_ok=True)
    spec = {**task.row(), "device": args.device, "runs": args.runs, "warmup": args.warmup,
            "scratch": str(spec_dir), "cudnn_benchmark": args.cudnn_benchmark,
            "build_budget_s": args.build_budget_s, "rebuild": args.rebuild,
            "timing_cache": str(args.timing_cache) if args.timing_cache else None, "gate": str(go),
            "fresh_first_call": args.fresh_first_call}
    spec_path, result_path = spec_dir / f"{name}.spec.json", spec_dir / f"{name}.row.json"
    spec_path.write_text(json.dumps(spec))
    last = [""]
    tag = f"[{task.variant}{f' lane {lane}' if args.lanes > 1 else ''}]"

    def relay(line: str) -> None:
        if line == REQUEST:
            gate.acquire(lane, go)
        elif line == DONE:
            gate.release(lane)
        if line.strip():
            last[0] = line.strip()
        if args.verbose or line.startswith(("build:", "building", "timing", "failed")):
            print(f"  {tag} {line}", flush=True)

    def beat(elapsed: float) -> None:
        print(f"  {tag} {elapsed:.0f} s of {deadline:.0f} s; last: {last[0][:160]}", flush=True)

    command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path), str(result_path)]
    try:
        done = run_with_deadline(command, deadline, env=child_env(), cwd=ROOT, on_line=relay, on_heartbeat=beat,
                                 heartbeat_s=args.heartbeat, on_start=lambda proc: gate.started(lane, proc))
    finally:
        gate.finished(lane)
    base = {**task.row(), "elapsed_s": done.elapsed_s, **({"lane": lane} if args.lanes > 1 else {})}
    if done.timed_out:
        return {**base, "status": "did not finish",
                "notes": f"did not finish in {deadline:.0f} s (killed; last: {last[0][:200]})"}
    if result_path.is_file():
        return {**base, **json.loads(result_path.read_text())}
    tail = " | ".join(line for line in done.tail[-3:] if line.strip())[:300]
    return {**base, "status": "failed", "notes": f"failed: child exit {done.returncode}: {tail}"}


class Run:
    """One call's tasks, taken by ``args.lanes`` lane threads in priority order (:func:`speed_lanes.next_task`)."""

    def __init__(self, args: argparse.Namespace, tasks: list[Task], results: Results, scratch: Path) -> None:
        self.args, self.results, self.scratch = args, results, scratch
        self.pending = list(tasks)
        self.finished: set[object] = set()
        self.observed: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.gate = GpuGate()
        self.started = time.monotonic()
        self.interrupted = False

    def _take(self, lane: int) -> tuple[Task | None, bool]:
        with self.lock:
            task, left = next_task(self.pending, lane, self.finished)
            if task is not None:
                self.pending.remove(task)  # type: ignore[arg-type]
            return task, left  # type: ignore[return-value]

    def _done(self, task: Task, row: dict[str, Any]) -> None:
        with self.lock:
            self.finished.add(task.key)
            if "elapsed_s" in row and row.get("status") != "skipped":
                self.observed[task.variant] = max(self.observed.get(task.variant, 0.0), row["elapsed_s"])
            self.results.add(row)

    def lane(self, lane: int) -> None:
        """Run tasks until none is left for this lane (or the call is stopped)."""
        args = self.args
        while not self.stop.is_set():
            task, left = self._take(lane)
            if task is None:
                if not left:
                    return
                time.sleep(0.5)  # a rebuild waits for its first build on another lane
                continue
            budget_left = args.budget - (time.monotonic() - self.started) - RESERVE_S
            deadline = min(args.deadline_map[task.variant], budget_left)
            expected = min(self.observed.get(task.variant, default_for(PRIORS_S, task.variant, 60.0)), deadline)
            if budget_left < max(expected, 1.0):
                self._done(task, {**task.row(), "status": "skipped",
                                  "notes": f"skipped: budget ({budget_left:.0f} s left, ~{expected:.0f} s expected)"})
                print(f"skip {task.key}: budget", flush=True)
                continue
            print(f"# {task.model} {task.precision} b{task.batch} {task.variant}: deadline {deadline:.0f} s"
                  + (f" (lane {lane})" if args.lanes > 1 else ""), flush=True)
            t0 = time.monotonic()
            row = _child_row(task, self.scratch, args, deadline, lane, self.gate)
            if self.stop.is_set():
                self._done(task, {**task.row(), "status": "interrupted", "elapsed_s": time.monotonic() - t0,
                                  "notes": f"interrupted after {time.monotonic() - t0:.0f} s"})
                return
            self._done(task, row)
            print(_row_line(row), flush=True)

    def run(self) -> None:
        """The lanes as threads; SIGTERM/SIGINT (raised here, in the main thread) stop them all."""
        # The main thread waits on a semaphore, not Thread.join: an exception raised by the signal
        # handler inside join() leaves CPython 3.11 reporting a running thread as finished.
        ended = threading.Semaphore(0)

        def lane(n: int) -> None:
            try:
                self.lane(n)
            finally:
                ended.release()

        for n in range(1, self.args.lanes + 1):
            threading.Thread(target=lane, args=(n,), name=f"lane-{n}", daemon=True).start()
        waiting = self.args.lanes
        try:
            while waiting:
                if ended.acquire(timeout=0.2):
                    waiting -= 1
        except Interrupted:
            self.interrupted = True
            self.stop.set()
            self.gate.resume_all()
            for proc in live_children():
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
            give_up = time.monotonic() + 30
            while waiting and ended.acquire(timeout=max(0.0, give_up - time.monotonic())):
                waiting -= 1


def run(args: argparse.Namespace) -> int:
    """Every task in a child, rows written as they come; 143 when interrupted, else 0."""
    if args.groups:
        tasks = tasks_of_groups(args.groups, args.precisions)
    else:
        variants = [*args.baselines, *(f"L{level}" for level in args.levels),
                    *(f"L{level}r" for level in args.levels if args.rebuild and level >= 4)]
        tasks = tasks_in_order(args.models, args.precisions, args.batches, variants)
    tasks = pin_lanes(tasks, args.lanes, args.lane_of)
    meta: dict[str, Any] = {
        "device_kind": args.device, "header": report_header(["python", *args.command], ROOT),
        "python": platform.python_version(), "budget_s": args.budget, "deadlines_s": args.deadline_map,
        "build_budget_s": args.build_budget_s, "cudnn_benchmark": args.cudnn_benchmark if args.device == "cuda"
        else None, "pairs": PAIRS, "runs": args.runs, "warmup": args.warmup, "lanes": args.lanes,
    }
    results = Results(args.out, meta)
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        with _scratch(args) as scratch:
            call = Run(args, tasks, results, scratch)
            call.run()
            meta["gate_pauses"] = call.gate.pauses
            status = 143 if call.interrupted else 0
    except Interrupted:
        status = 143
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for proc in live_children():
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
    print(results.write(), flush=True)
    return status


@contextlib.contextmanager
def _scratch(args: argparse.Namespace) -> Iterator[Path]:
    if args.keep_scratch:
        folder = args.out / "scratch"
        folder.mkdir(parents=True, exist_ok=True)
        yield folder
        return
    # a killed child's compile workers (sessions of their own) may still be writing here: the table is
    # written after this, so a folder that will not empty must not end the call (2026-12-05, H100)
    with tempfile.TemporaryDirectory(prefix="engine-speed-", ignore_cleanup_errors=True) as tmp:
        yield Path(tmp)


# --- tables ----------------------------------------------------------------------------------

def read_jsonl(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The meta and rows of one call's ``engine-speed.jsonl`` (a cut-off last line is ignored)."""
    meta: dict[str, Any] = {}
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "meta" in item:
            meta = item["meta"]
        elif "row" in item:
            rows.append(item["row"])
    return meta, rows


def merge(paths: list[Path]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One table from several calls' JSONL files: every call's header, rows in file order."""
    metas, rows = [], []
    for path in paths:
        meta, got = read_jsonl(path)
        metas.append(meta)
        rows += got
    kinds = {m.get("device_kind") for m in metas}
    if len(kinds) > 1:
        raise SystemExit(f"--merge: runs on different device kinds {sorted(map(str, kinds))}")
    meta = dict(metas[0])
    meta["merged"] = [m.get("header", []) for m in metas]
    return meta, rows


def _call_lines(meta: dict[str, Any]) -> list[str]:
    """One call's lanes, budget and deadlines (a merged table gives each call's command instead)."""
    return [
        *([f"- lanes: {meta['lanes']} children built at a time (build seconds overlap the other lane's build); "
           f"timed runs never overlapped: the other lanes' processes were stopped during each "
           f"({meta.get('gate_pauses', 0)} pauses)"] if (meta.get("lanes") or 1) > 1 else []),
        f"- budget {_fmt(meta.get('budget_s'), '.0f')} s, spent {_fmt(meta.get('spent_s'), '.0f')} s; deadlines "
        + ", ".join(f"{k} {v:.0f} s" for k, v in (meta.get("deadlines_s") or {}).items())
        + f"; plan build budget {meta.get('build_budget_s') if meta.get('build_budget_s') is not None else 'default'}",
    ]


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``x_eager`` and ``x_pair``: throughput over eager's and over the paired torch.compile row's."""
    def find(row: dict[str, Any], variant: str) -> dict[str, Any] | None:
        key = (row["model"], row["precision"], row["batch"])
        return next((r for r in rows if r.get("ms") and r["variant"] == variant
                     and (r["model"], r["precision"], r["batch"]) == key), None)

    for row in rows:
        if not row.get("ms"):
            continue
        eager, pair = find(row, "eager"), find(row, PAIRS.get(base_variant(row["variant"]), ""))
        if eager:
            row["x_eager"] = eager["ms"] / row["ms"]
        if pair:
            row["x_pair"] = pair["ms"] / row["ms"]


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def _row_line(row: dict[str, Any]) -> str:
    roof = _fmt(100 * row["roofline"], ".1f") + "%" if "roofline" in row else "-"
    return (f"{row['model']} {row['precision']} b{row['batch']} {row['variant']}: {row.get('status', '')} "
            f"build {_fmt(row.get('build_s'), '.1f')} s, {_fmt(row.get('ms'), '.3f')} ms, "
            f"{_fmt(row.get('images_per_s'), '.0f')} img/s, roofline {roof}, "
            f"rel L2 {_fmt(row.get('rel_l2'), '.1e')} {row.get('notes', '')}")


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The report: header lines (every merged call's), then one table per model."""
    rows = [dict(r) for r in rows]
    add_ratios(rows)
    cuda = meta.get("device_kind") == "cuda"
    devices = sorted({r["device_name"] for r in rows if r.get("device_name")})
    peaks = peaks_for(devices[0]) if cuda and devices else None
    lines = ["# Engine speed: StreamRT plans by optimization level vs eager PyTorch and torch.compile", ""]
    for header in meta.get("merged") or [meta.get("header", [])]:
        lines += [*header, ""] if meta.get("merged") else header
    lines += [
        f"- device: {', '.join(devices) or meta.get('device_kind')}; "
        + ", ".join(sorted({f"torch {r['torch']}" for r in rows if r.get("torch")})),
        "- timing: " + ("CUDA events around each call on the current stream" if cuda else "host clock (perf_counter)")
        + f", median of {meta.get('runs')} runs after {meta.get('warmup')} warm-up, 4 rotating randn inputs; "
        "every variant built and timed in its own child process with a deadline",
        "- pairings (x pair): L0-L3 vs torch.compile mode='reduce-overhead', L4-L5 vs mode='max-autotune'"
        if cuda else "- CPU: no CUDA graphs; torch.compile default mode; compile_threads=1",
        "- roofline: FLOPs (FlopCounterMode) x images/s / "
        + (f"{peaks.name} dense peak of the precision (fp16/bf16 {peaks.fp16:g}, tf32 {peaks.tf32:g}, fp32 "
           f"{peaks.fp32:g} TFLOP/s; {peaks.source})" if peaks else "unknown device: no roofline column"),
        *(_call_lines(meta) if not meta.get("merged") else
          [f"- merged from {len(meta['merged'])} calls: each call's lanes, budget and deadlines are in its command "
           "above; timed runs never overlapped within a call"]),
        "",
    ]
    for model in dict.fromkeys(r["model"] for r in rows):
        info = next((r for r in rows if r["model"] == model and r.get("source")), {})
        title = f"## {model}" + (f": {info['source']}, input {'x'.join(map(str, info['input']))}, "
                                 f"{info['gflop_per_image']:.3f} GFLOP per image" if info else "")
        lines += [title, "", "| precision | batch | variant | status | CUDA graphs | build s | median ms | images/s "
                  "| x eager | x pair | roofline | rel. L2 vs fp32 | notes |",
                  "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in (r for r in rows if r["model"] == model):
            graphs = "" if "graphs" not in r else ("yes" if r["graphs"] else "no")
            roof = _fmt(100 * r["roofline"], ".1f") + "%" if "roofline" in r else ""
            lines.append(f"| {r['precision']} | {r['batch']} | {r['variant']} | {r.get('status', '')} | {graphs} "
                         f"| {_fmt(r.get('build_s'), '.1f')} | {_fmt(r.get('ms'), '.3f')} "
                         f"| {_fmt(r.get('images_per_s'), '.0f')} | {_fmt(r.get('x_eager'), '.2f')} "
                         f"| {_fmt(r.get('x_pair'), '.2f')} | {roof} | {_fmt(r.get('rel_l2'), '.1e')} "
                         f"| {r.get('notes', '')} |")
        lines.append("")
    return "\n".join(lines) + "\n"


# --- command line ----------------------------------------------------------------------------

def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _deadlines(text: str) -> dict[str, float]:
    out = {}
    for item in _names(text):
        key, _, value = item.partition("=")
        out[key.strip()] = float(value)
    return out


def _groups(text: str) -> list[tuple[str, list[int], list[str]]]:
    """``MODEL@B,B=V,V;MODEL@B=V``: the tasks of each group in the order written."""
    out = []
    for item in (g.strip() for g in text.split(";") if g.strip()):
        head, sep, variants = item.partition("=")
        model, at, batches = head.partition("@")
        if not (sep and at and variants):
            raise argparse.ArgumentTypeError(f"--groups: expected MODEL@BATCHES=VARIANTS, got {item!r}")
        out.append((model.strip(), _ints(batches), _names(variants)))
        if any(not lane.isdigit() for v in out[-1][2] for _, slash, lane in [v.partition("/")] if slash):
            raise argparse.ArgumentTypeError(f"--groups: a lane pin is V/N with N a lane number, got {item!r}")
    return out


def _lane_of(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in _deadlines(text).items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("out/engine-speed"), help="folder for engine-speed.md/.jsonl")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny model, batch 1, fp32, levels 0,3, eager + torch.compile "
                   "(the CI smoke run; use with --device cpu)")
    p.add_argument("--models", type=_names, default=None, help=f"comma list of {sorted(CANDIDATES)} (default resnet50)")
    p.add_argument("--batches", type=_ints, default=None, help="comma list (default 32,1)")
    p.add_argument("--levels", type=_ints, default=None, help="StreamRT optimization levels (default 0,3,5)")
    p.add_argument("--precisions", type=_names, default=None, help="comma list of fp16,bf16,fp32,tf32 (default fp16)")
    p.add_argument("--baselines", type=_names, default=None,
                   help=f"comma list of {','.join(BASELINES)} (default eager,compile,max-autotune)")
    p.add_argument("--budget", type=float, default=540.0, metavar="SECONDS",
                   help="the whole call ends within this (default 540): no child outlives what is left")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS", help="deadline of every variant")
    p.add_argument("--deadlines", type=_deadlines, default={}, metavar="V=S,...",
                   help="per-variant deadlines, e.g. L5=200,max-autotune=240")
    p.add_argument("--build-budget-s", type=float, default=None, metavar="SECONDS",
                   help="plans' BuildConfig.build_budget_s (0: none; default: BuildConfig's)")
    p.add_argument("--timing-cache", type=Path, default=None, help="plans' --timing-cache directory (shared)")
    p.add_argument("--rebuild", action="store_true", help="after each level >= 4 plan, build it again into the "
                   "same timing cache (variant L5r: the warm rebuild's time and timing-cache hits)")
    p.add_argument("--groups", type=_groups, default=None, metavar="MODEL@B,B=V,V;...",
                   help="run exactly these, in this order (most important first), e.g. "
                   "'resnet50@32=L5,L5r,max-autotune,eager,compile,L3;mobilenet@32,1=compile,L3' "
                   "(replaces --models/--batches/--levels/--baselines; L5r implies --rebuild; V/N pins V of that group "
                   "to lane N)")
    p.add_argument("--lanes", type=int, default=1, help="children building at a time (default 1); timed runs "
                   "never overlap: the other lanes are stopped while one times (speed_lanes.py)")
    p.add_argument("--lane-of", type=_lane_of, default={}, metavar="V=N,...",
                   help="pin variants to lanes 1..N (default with 2+ lanes: autotuning variants on lane 1)")
    p.add_argument("--runs", type=int, default=None, help="timed calls per variant (default 200; quick 10)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls per variant (default 20; quick 2)")
    p.add_argument("--heartbeat", type=float, default=30.0, help="seconds between progress lines of a child")
    p.add_argument("--no-cudnn-benchmark", dest="cudnn_benchmark", action="store_false",
                   help="leave torch.backends.cudnn.benchmark off (default: on for every variant)")
    p.add_argument("--keep-scratch", action="store_true", help="keep plans and caches under OUT/scratch")
    p.add_argument("--fresh-first-call", action="store_true", help="after each plan's build, time its load and "
                   "first call in a new process (first_call.py: what a starting server waits for; in the notes)")
    p.add_argument("--verbose", action="store_true", help="relay every line the children print")
    p.add_argument("--merge", type=Path, nargs="+", metavar="JSONL", help="one table from earlier calls (runs nothing)")
    args = p.parse_args(argv)
    args.command = ["benchmarks/engine_speed.py", *(argv if argv is not None else sys.argv[1:])]
    if args.merge:
        return args
    quick = args.quick
    args.models = args.models or (["tiny"] if quick else ["resnet50"])
    args.batches = args.batches or ([1] if quick else [32, 1])
    args.levels = args.levels if args.levels is not None else ([0, 3] if quick else [0, 3, 5])
    args.precisions = args.precisions or (["fp32"] if quick else ["fp16"])
    args.baselines = args.baselines if args.baselines is not None else (
        ["eager", "compile"] if quick else ["eager", "compile", "max-autotune"])
    args.runs = args.runs or (10 if quick else 200)
    args.warmup = args.warmup or (2 if quick else 20)
    pins: list[int] = []
    if args.groups:
        args.models = list(dict.fromkeys(m for m, _, _ in args.groups))
        grouped = [v.partition("/")[0] for _, _, vs in args.groups for v in vs]
        pins = [int(v.partition("/")[2]) for _, _, vs in args.groups for v in vs if "/" in v]
        args.baselines = [v for v in dict.fromkeys(grouped) if level_of(v) is None]
        args.levels = sorted({level for v in grouped if (level := level_of(v)) is not None})
        args.rebuild = args.rebuild or any(is_rebuild(v) for v in grouped)
        unknown = [v for v in grouped if level_of(v) is None and v not in BASELINES]
        if unknown:
            p.error(f"--groups: unknown variants {unknown}; known: L0..L5 (each level's defaults), L4r, L5r, L5w, "
                    "L3c/L5c/L5s (cuDNN epilogues), L5i (Inductor's), then b/n (cuDNN benchmark on/off: L5cn), "
                    f"{', '.join(BASELINES)}")
    if args.lanes < 1 or any(not 1 <= n <= args.lanes for n in [*args.lane_of.values(), *pins]):
        p.error(f"--lanes must be >= 1 and --lane-of lanes within 1..{args.lanes}, got {args.lane_of}")
    for name, values, known in (("--models", args.models, CANDIDATES), ("--precisions", args.precisions, DTYPES),
                                ("--baselines", args.baselines, BASELINES)):
        unknown = [v for v in values if v not in known]
        if unknown:
            p.error(f"{name}: unknown {unknown}; known: {sorted(known)}")
    if any(not 0 <= level <= 5 for level in args.levels):
        p.error(f"--levels must be in 0..5, got {args.levels}")
    variants = {*args.baselines, *(f"L{level}" for level in args.levels),
                *(f"L{level}r" for level in args.levels if args.rebuild and level >= 4)}
    if args.groups:
        variants = set(grouped)
    unknown = sorted(v for v in args.deadlines if base_variant(v) not in DEADLINES_S and level_of(v) is None)
    if unknown:
        p.error(f"--deadlines: unknown variants {unknown}; known: {sorted(DEADLINES_S)}")
    args.deadline_map = {v: float(args.deadlines.get(v, args.deadline or default_for(DEADLINES_S, v, 240.0)))
                         for v in sorted(variants)}
    for line in short_deadlines(args.deadline_map, args.build_budget_s):
        print(f"warning: {line}", file=sys.stderr)
    if args.device == "cpu" and any(p_ in ("fp16", "bf16", "tf32") for p_ in args.precisions):
        p.error("--device cpu runs fp32 only (half precision is emulated on CPUs)")
    return args


BUILD_MARGIN_S = 30.0
"""What a level-4/5 build needs past its build budget: export, verification, writing, then the timing runs."""


def short_deadlines(deadlines: dict[str, float], build_budget_s: float | None) -> list[str]:
    """First builds (level 4-5, not rebuilds) whose deadline cannot let the plan's own build budget bound them: the
    benchmark kills such a build first, and a row that the budget would have finished reads "did not finish" (a
    170 s deadline under a 200 s budget on an H100, 2026-12-06)."""
    budget = 300.0 if build_budget_s is None else build_budget_s  # BuildConfig's default
    if not budget:  # 0: no budget, nothing bounds the build but the deadline
        return []
    need = budget + BUILD_MARGIN_S
    return [f"{v}'s deadline {s:.0f} s is under its {budget:.0f} s build budget + {BUILD_MARGIN_S:.0f} s: the "
            f"benchmark may kill the build before the budget bounds it (give --deadlines {v}={need:.0f} or a "
            "smaller --build-budget-s)"
            for v, s in deadlines.items()
            if (level_of(v) or 0) >= 4 and not base_variant(v).endswith(("r", "w")) and s < need]


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        from speed_variants import worker_main

        return worker_main(Path(sys.argv[2]), Path(sys.argv[3]))
    args = parse_args(argv)
    if not args.merge:
        return run(args)
    meta, rows = merge(args.merge)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "engine-speed.jsonl").open("w") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        f.writelines(json.dumps({"row": row}) + "\n" for row in rows)
    text = markdown(rows, meta)
    (args.out / "engine-speed.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
