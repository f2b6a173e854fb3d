"""Engine speed: StreamRT plans at optimization levels against eager PyTorch and torch.compile, with the roofline.

For each model, precision and batch, side by side in one process, on fresh random (non-zero)
inputs rotated over 4 sets, timed after warm-up with CUDA events (host clock on the CPU), median
of many runs:

* **StreamRT** torch_inductor plans built from the module at each ``--levels`` (static shapes at
  the batch; plan inputs in the plan's precision, no casts), run through the plan's default
  context: CUDA graphs on the GPU. Build time is ``build_module``'s wall time with a fresh
  Inductor disk cache per build.
* **eager**: the module in the same precision (``torch.no_grad``).
* **compile**: ``torch.compile(mode="reduce-overhead")`` on the GPU: Inductor's default kernel
  choices plus CUDA graphs, the fair partner of a StreamRT plan below level 4 (which replays CUDA
  graphs). On the CPU, ``torch.compile()`` (default mode; no graphs there).
* **max-autotune**: ``torch.compile(mode="max-autotune")``, which autotunes matmuls/convolutions
  and uses CUDA graphs by default: the partner of StreamRT at level 5.
* **compile-plain** (opt-in): ``torch.compile()`` default mode, no CUDA graphs: what a user tries first.

"build s" of a torch.compile variant is the first call (compilation) plus the calls until its
CUDA graph is recorded. The roofline column is FLOPs per image (``FlopCounterMode`` on the
module) x images/s over the device's datasheet peak for the precision
(:mod:`streamrt.profiling.peaks`; blank for an unknown device). "rel. L2" compares the first
output with eager fp32 (TF32 off) on the same input.

``--budget SECONDS`` stops starting new builds when the time already spent plus the expected
build time (measured earlier in the run, else a prior for a ResNet-50-sized model on an H200)
would pass the budget; skipped rows say so. Each batch's comparison runs whole before the next
batch's (the first batch named is the one that gets measured when time is short), and within a
batch eager, then the cheap builds (levels <= 3, compile), then the autotuning ones (level >= 4,
max-autotune), StreamRT's first in each group. ``--merge A.json B.json ...`` writes one table from
several runs (e.g. two device calls that each fit the per-call limit).

Usage:
    python benchmarks/engine_speed.py --out DIR                      # ResNet-50 fp16, batch 32 and 1 (H200)
    python benchmarks/engine_speed.py --out DIR --models resnet50,mobilenet,yolo,transformer \\
        --precisions fp16,fp32,tf32 --budget 540
    python benchmarks/engine_speed.py --out DIR --device cpu --quick  # tiny CPU smoke run (CI)

Writes DIR/engine-speed.md (tables with date, commit, device, command) and DIR/engine-speed.json.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from streamrt import load
from streamrt.backends.torch_inductor.tf32 import set_tf32
from streamrt.config import BuildConfig
from streamrt.module_builder import build_module
from streamrt.profiling.flops import count_flops
from streamrt.profiling.peaks import peak_precision, peaks_for
from streamrt.profiling.provenance import git_commit

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}
PRIORS_S = {"eager": 5.0, "compile": 30.0, "compile-plain": 20.0, "max-autotune": 260.0, "L0": 70.0, "L1": 70.0,
            "L2": 80.0, "L3": 90.0, "L4": 260.0, "L5": 260.0}
"""Expected seconds (build + timing) of a ResNet-50-sized model on an H200, until one is measured: from
shared/reference/h200-2026-12-01.md (plan fp16 build 82 s; torch.compile default 13 s, max-autotune 246 s)."""
PAIRS = {"L0": "compile", "L1": "compile", "L2": "compile", "L3": "compile", "L4": "max-autotune",
         "L5": "max-autotune"}
"""The torch.compile variant each StreamRT level is compared with (same CUDA-graph use, same tuning effort)."""


# --- models ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Model:
    """A model made from the first candidate source that imports here."""

    key: str
    net: torch.nn.Module
    shape: tuple[int, ...]
    source: str


def _torchvision(name: str) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None)  # type: ignore[no-any-return]

    return make


def _timm(name: str) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        import timm

        return timm.create_model(name, pretrained=False)  # type: ignore[no-any-return]

    return make


def _zoo(name: str) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        from streamrt.testing.zoo import MODELS

        return MODELS[name].make()

    return make


def _yolo() -> torch.nn.Module:
    from streamrt.testing.yolo import yolo_like

    return yolo_like(num_classes=80)


CANDIDATES: dict[str, list[tuple[str, Callable[[], torch.nn.Module], tuple[int, ...]]]] = {
    "resnet50": [("torchvision resnet50", _torchvision("resnet50"), (3, 224, 224)),
                 ("timm resnet50", _timm("resnet50"), (3, 224, 224)),
                 ("StreamRT zoo ResNetLike (stand-in: no torchvision/timm)", _zoo("resnet"), (3, 224, 224))],
    "mobilenet": [("torchvision mobilenet_v3_large", _torchvision("mobilenet_v3_large"), (3, 224, 224)),
                  ("timm mobilenetv3_large_100", _timm("mobilenetv3_large_100"), (3, 224, 224)),
                  ("StreamRT zoo MobileNetLike", _zoo("mobilenet"), (3, 224, 224))],
    "yolo": [("StreamRT yolo_like (YOLOv8n-sized, 80 classes)", _yolo, (3, 640, 640))],
    "transformer": [("timm vit_small_patch16_224", _timm("vit_small_patch16_224"), (3, 224, 224)),
                    ("StreamRT zoo ViTLike (2 layers, 32x32)", _zoo("vit"), (3, 32, 32))],
    "tiny": [("StreamRT zoo MTCNNPNet (3 convs, 2 outputs)", _zoo("mtcnn"), (3, 48, 48))],
}


def make_model(key: str) -> Model:
    """The model ``key`` from its first source that imports (torchvision, then timm, then the repo's)."""
    errors = []
    for source, make, shape in CANDIDATES[key]:
        try:
            torch.manual_seed(0)
            return Model(key, make().eval(), shape, source)
        except ImportError as exc:
            errors.append(f"{source}: {exc}")
    raise SystemExit(f"no source for model {key}: {'; '.join(errors)}")


# --- timing ----------------------------------------------------------------------------------

def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[torch.Tensor], Any], inputs: list[torch.Tensor], runs: int, warmup: int,
              device: str) -> float:
    """Median time of ``fn`` over ``runs`` calls on rotating inputs after ``warmup`` calls.

    CUDA: events around each call on the current stream; CPU: the host clock.
    """
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    _sync(device)
    times = []
    for i in range(runs):
        x = inputs[i % len(inputs)]
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(x)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return first_tensor(next(iter(out.values())))
    return first_tensor(out[0])


def rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    g, r = got.detach().double().cpu(), ref.detach().double().cpu()
    return float((g - r).norm() / r.norm())


@contextlib.contextmanager
def fresh_inductor_cache(root: Path, name: str) -> Iterator[Path]:
    """``TORCHINDUCTOR_CACHE_DIR`` at a new folder for one torch.compile variant, restored after."""
    folder = root / name
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def set_precision_mode(precision: str) -> None:
    """TF32 on only for tf32 (process-wide; a loaded plan sets it too, so it is set before every variant)."""
    set_tf32(precision == "tf32")


def plan_config(precision: str, level: int, device: str) -> tuple[BuildConfig, str]:
    """The BuildConfig of a plan; TF32 through ``BuildConfig.tf32`` where it exists, else ``precision="tf32"``."""
    fields = {f.name for f in dataclasses.fields(BuildConfig)}
    extra: dict[str, Any] = {}
    plan_precision = precision
    note = ""
    if precision == "tf32":
        if "tf32" in fields:
            plan_precision, extra["tf32"] = "fp32", True
            note = "fp32 + BuildConfig.tf32"
        else:
            note = "precision tf32 (BuildConfig has no tf32 field in this tree)"
    config = BuildConfig(backend="torch_inductor", precision=plan_precision, optimization_level=level,
                         keep_io_types=False, backend_options={"device": device}, **extra)
    return config, note


# --- the run ---------------------------------------------------------------------------------

@dataclass
class Budget:
    seconds: float
    started: float = dataclasses.field(default_factory=time.perf_counter)
    observed: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def spent(self) -> float:
        return time.perf_counter() - self.started

    def allows(self, variant: str) -> tuple[bool, float]:
        expected = self.observed.get(variant, PRIORS_S.get(variant, 60.0))
        return self.spent + expected <= self.seconds, expected


@dataclass(frozen=True)
class Task:
    model: str
    precision: str
    batch: int
    variant: str

    @property
    def tier(self) -> int:
        if self.variant == "eager":
            return 0
        if self.variant == "max-autotune" or (self.variant.startswith("L") and int(self.variant[1:]) >= 4):
            return 2
        return 1


def tasks_in_order(models: list[str], precisions: list[str], batches: list[int], variants: list[str]) -> list[Task]:
    """Every (model, precision, batch, variant): one batch's whole comparison before the next batch's,
    and within it eager, then the cheap builds, then the autotuning ones (level >= 4, max-autotune),
    StreamRT before torch.compile within a tier."""
    tasks = [Task(m, p, b, v) for m in models for p in precisions for b in batches for v in variants]
    order = {t: i for i, t in enumerate(tasks)}
    return sorted(tasks, key=lambda t: (order[Task(t.model, t.precision, t.batch, variants[0])], t.tier,
                                        not t.variant.startswith("L"), order[t]))


def run_variant(task: Task, model: Model, inputs: list[torch.Tensor], args: argparse.Namespace,
                scratch: Path) -> dict[str, Any]:
    """Build (or compile) one variant, time it, and return its row (without the derived columns)."""
    device, dtype = args.device, DTYPES[task.precision]
    row: dict[str, Any] = {"model": task.model, "precision": task.precision, "batch": task.batch,
                           "variant": task.variant}
    x = [t.to(dtype) for t in inputs]
    set_precision_mode(task.precision)
    cleanup: list[Callable[[], None]] = []
    if task.variant.startswith("L"):
        level = int(task.variant[1:])
        config, note = plan_config(task.precision, level, device)
        with torch.no_grad():
            outputs = first_level(model.net(inputs[0][:1].float()))
        names = [f"out{i}" for i in range(outputs)]
        t0 = time.perf_counter()
        tag = f"{task.model}-{task.precision}-b{task.batch}-{task.variant}"
        built = build_module(model.net, [x[0]], scratch / f"{tag}.plan", config, input_names=["input"],
                             output_names=names, cache_dir=scratch / f"cache-{tag}")
        row["build_s"] = time.perf_counter() - t0
        engine = load(built.path)
        ctx = engine.create_context()
        cleanup += [ctx.close, engine.close]
        row["graphs"] = bool(getattr(ctx, "cuda_graph", False))
        row["notes"] = "; ".join(n for n in (note, f"pair: {PAIRS[task.variant]}" if device == "cuda" else "") if n)
        set_precision_mode(task.precision)  # loading a plan set TF32 for it: same value, stated again

        def fn(t: torch.Tensor) -> Any:
            return ctx.infer({"input": t})[names[0]]

    else:
        net = copy.deepcopy(model.net).to(device=device, dtype=dtype)
        if task.variant == "eager":
            compiled: Any = net
            row["graphs"] = False
        else:
            torch._dynamo.reset()
            mode = {"compile": "reduce-overhead" if device == "cuda" else None, "compile-plain": None,
                    "max-autotune": "max-autotune"}[task.variant]
            compiled = torch.compile(net, mode=mode, dynamic=False)
            row["graphs"] = device == "cuda" and mode is not None
            row["notes"] = f"torch.compile(mode={mode!r}, dynamic=False)"
        step = getattr(torch.compiler, "cudagraph_mark_step_begin", None) if row["graphs"] else None

        def fn(t: torch.Tensor) -> Any:
            if step is not None:
                step()
            return compiled(t)

        if task.variant != "eager":
            with fresh_inductor_cache(scratch, f"compile-{id(task)}"), torch.no_grad():
                t0 = time.perf_counter()
                for i in range(3):  # compile, then (reduce-overhead) warm up and record the graph
                    fn(x[i % len(x)])
                _sync(device)
                row["build_s"] = time.perf_counter() - t0
    try:
        with torch.no_grad():
            row["ms"] = median_ms(fn, x, args.runs, args.warmup, device)
            row["output"] = first_tensor(fn(x[0])).clone()
            _sync(device)
    finally:
        for close in cleanup:
            close()
    return row


def first_level(out: Any) -> int:
    """How many outputs a module returns (a tensor is one)."""
    return 1 if isinstance(out, torch.Tensor) else len(out)


def add_x_eager(rows: list[dict[str, Any]]) -> None:
    """Speed-up over eager of the same model, precision and batch, where eager was measured."""
    for row in rows:
        eager = next((r for r in rows if r.get("ms") and r["variant"] == "eager" and
                      (r["model"], r["precision"], r["batch"]) == (row["model"], row["precision"], row["batch"])), None)
        if eager and row.get("ms"):
            row["x_eager"] = eager["ms"] / row["ms"]


def merge(paths: list[Path]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One table from several runs' JSON files: rows in file order, the commands of every run."""
    runs = [json.loads(p.read_text()) for p in paths]
    meta = dict(runs[0]["meta"])
    devices = {r["meta"]["device"] for r in runs}
    if len(devices) > 1:
        raise SystemExit(f"--merge: runs from different devices {sorted(devices)}")
    meta["command"] = " ; ".join(r["meta"]["command"] for r in runs)
    meta["commit"] = " / ".join(dict.fromkeys(r["meta"]["commit"] for r in runs))
    meta["models"] = {k: v for r in runs for k, v in r["meta"]["models"].items()}
    meta["spent_s"] = sum(r["meta"]["spent_s"] for r in runs)
    meta["budget_s"] = sum(r["meta"]["budget_s"] for r in runs)
    rows = [row for r in runs for row in r["rows"]]
    add_x_eager(rows)
    return rows, meta


def reference_output(model: Model, x: torch.Tensor, device: str) -> torch.Tensor:
    set_tf32(False)
    net = copy.deepcopy(model.net).to(device=device, dtype=torch.float32)
    with torch.no_grad():
        return first_tensor(net(x.float())).clone()


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    device = args.device
    budget = Budget(args.budget)
    if device == "cuda":
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
    else:
        # On a small shared CPU machine the compile worker pool's start-up (each worker imports
        # torch) costs more than the parallel compiles save; GPU runs keep Inductor's default.
        import torch._inductor.config as inductor_config

        from streamrt.device.threads import resolve_cpu_threads

        inductor_config.compile_threads = 1
        torch.set_num_threads(resolve_cpu_threads(None))  # eager and torch.compile get the plans' thread count
    variants = [*args.baselines, *(f"L{level}" for level in args.levels)]
    tasks = tasks_in_order(args.models, args.precisions, args.batches, variants)
    peaks = peaks_for(torch.cuda.get_device_name()) if device == "cuda" else None
    models: dict[str, Model] = {}
    per_image: dict[str, float] = {}
    inputs: dict[tuple[str, int], list[torch.Tensor]] = {}
    refs: dict[tuple[str, int], torch.Tensor] = {}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="engine-speed-") as tmp:
        scratch = Path(tmp)
        for task in tasks:
            if task.model not in models:
                models[task.model] = m = make_model(task.model)
                m.net.to(device)
                flops = count_flops(m.net, [torch.randn(1, *m.shape, device=device)])
                per_image[task.model] = flops.per_item
                print(f"# {task.model}: {m.source}, input {m.shape}, {flops.per_item / 1e9:.3f} GFLOP per image",
                      flush=True)
            model = models[task.model]
            key = (task.model, task.batch)
            if key not in inputs:
                gen = torch.Generator(device="cpu").manual_seed(task.batch)
                inputs[key] = [torch.randn(task.batch, *model.shape, generator=gen).to(device) for _ in range(4)]
                refs[key] = reference_output(model, inputs[key][0], device)
            ok, expected = budget.allows(task.variant)
            if not ok:
                rows.append({"model": task.model, "precision": task.precision, "batch": task.batch,
                             "variant": task.variant,
                             "notes": f"skipped: budget ({budget.spent:.0f} s spent, ~{expected:.0f} s expected, "
                                      f"budget {budget.seconds:.0f} s)"})
                print(f"skip {task}: budget", flush=True)
                continue
            t0 = time.perf_counter()
            try:
                row = run_variant(task, model, inputs[key], args, scratch)
            except Exception as exc:  # one failing variant must not lose the rest of the table
                row = {"model": task.model, "precision": task.precision, "batch": task.batch,
                       "variant": task.variant, "notes": f"failed: {type(exc).__name__}: {str(exc)[:200]}"}
            budget.observed[task.variant] = max(budget.observed.get(task.variant, 0.0), time.perf_counter() - t0)
            out = row.pop("output", None)
            if out is not None:
                row["rel_l2"] = rel_l2(out, refs[key])
                row["images_per_s"] = task.batch / row["ms"] * 1e3
                if peaks is not None:
                    row["roofline"] = per_image[task.model] * row["images_per_s"] / (
                        peaks.tflops(task.precision) * 1e12)
            rows.append(row)
            print(_row_line(row), flush=True)
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    add_x_eager(rows)
    meta = {
        "device_kind": device,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": git_commit(Path(__file__).resolve().parent),
        "device": torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or 'unknown'})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "command": "python " + shlex.join(["benchmarks/engine_speed.py", *sys.argv[1:]]),
        "models": {k: {"source": m.source, "input": list(m.shape), "gflop_per_image": per_image[k] / 1e9}
                   for k, m in models.items()},
        "peaks": peaks.to_json() if peaks is not None else None,
        "cudnn_benchmark": bool(args.cudnn_benchmark) if device == "cuda" else None,
        "budget_s": args.budget,
        "spent_s": budget.spent,
        "pairs": PAIRS,
    }
    return rows, meta


# --- output ----------------------------------------------------------------------------------

def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def _row_line(row: dict[str, Any]) -> str:
    roof = _fmt(100 * row["roofline"], ".1f") + "%" if "roofline" in row else "-"
    return (f"{row['model']} {row['precision']} b{row['batch']} {row['variant']}: "
            f"build {_fmt(row.get('build_s'), '.1f')} s, {_fmt(row.get('ms'), '.3f')} ms, "
            f"{_fmt(row.get('images_per_s'), '.0f')} img/s, roofline {roof}, "
            f"rel L2 {_fmt(row.get('rel_l2'), '.1e')} {row.get('notes', '')}")


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any], device: str) -> str:
    peaks = meta["peaks"]
    timing = ("CUDA events around each call on the current stream" if device == "cuda" else "host clock")
    lines = [
        "# Engine speed: StreamRT plans by optimization level vs eager PyTorch and torch.compile",
        "",
        f"- date: {meta['date']}",
        f"- commit: {meta['commit']}",
        f"- device: {meta['device']}, torch {meta['torch']}, CUDA {meta['cuda']}, python {meta['python']}",
        f"- command: `{meta['command']}`",
        f"- timing: {timing}, median after warm-up, 4 rotating random inputs (randn); build = cold Inductor disk "
        "cache per build (in-process caches are not cleared between builds)",
        "- pairings: StreamRT L0-L3 (CUDA graphs) vs torch.compile mode='reduce-overhead' (CUDA graphs, default "
        "kernels); StreamRT L4-L5 vs mode='max-autotune' (autotuned matmul/conv, CUDA graphs by default)"
        if device == "cuda" else "- pairings: CPU: no CUDA graphs anywhere; torch.compile default mode; Inductor "
        "compiles in-process (compile_threads=1) for every build; eager and torch.compile use the plans' thread "
        f"count ({torch.get_num_threads()})",
        f"- cudnn.benchmark = {meta['cudnn_benchmark']} for every variant" if device == "cuda" else "",
        "- roofline: FLOPs per image (torch.utils.flop_counter.FlopCounterMode) x images/s / "
        + (f"{peaks['name']} dense peak of the precision (fp16/bf16 {peaks['fp16_bf16_dense_tflops']}, tf32 "
           f"{peaks['tf32_dense_tflops']}, fp32 {peaks['fp32_tflops']} TFLOP/s; {peaks['source']})"
           if peaks else "unknown device: no roofline column"),
        f"- budget {meta['budget_s']:.0f} s, spent {meta['spent_s']:.0f} s",
        "",
    ]
    for key, info in meta["models"].items():
        lines += [f"## {key}: {info['source']}, input {'x'.join(map(str, info['input']))}, "
                  f"{info['gflop_per_image']:.3f} GFLOP per image", "",
                  "| precision | batch | variant | CUDA graphs | build s | median ms | images/s | x eager | roofline "
                  "| rel. L2 vs fp32 | notes |",
                  "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            if r["model"] != key:
                continue
            graphs = "" if "graphs" not in r else ("yes" if r["graphs"] else "no")
            roof = _fmt(100 * r["roofline"], ".1f") + "%" if "roofline" in r else ""
            lines.append(f"| {r['precision']} | {r['batch']} | {r['variant']} | {graphs} "
                         f"| {_fmt(r.get('build_s'), '.1f')} | {_fmt(r.get('ms'), '.3f')} "
                         f"| {_fmt(r.get('images_per_s'), '.0f')} "
                         f"| {_fmt(r.get('x_eager'), '.2f')} | {roof} | {_fmt(r.get('rel_l2'), '.1e')} "
                         f"| {r.get('notes', '')} |")
        lines.append("")
    return "\n".join(line for line in lines if line is not None) + "\n"


# --- command line ----------------------------------------------------------------------------

def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("out/engine-speed"), help="folder for engine-speed.md/.json")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny model, batch 1, fp32, levels 0,3, eager + torch.compile "
                   "(the CI smoke run; use with --device cpu)")
    p.add_argument("--models", type=_names, default=None, help=f"comma list of {sorted(CANDIDATES)} (default resnet50)")
    p.add_argument("--batches", type=_ints, default=None, help="comma list (default 32,1)")
    p.add_argument("--levels", type=_ints, default=None, help="StreamRT optimization levels (default 0,3,5)")
    p.add_argument("--precisions", type=_names, default=None, help="comma list of fp16,bf16,fp32,tf32 (default fp16)")
    p.add_argument("--baselines", type=_names, default=None,
                   help="comma list of eager,compile,max-autotune,compile-plain (default eager,compile,max-autotune)")
    p.add_argument("--budget", type=float, default=450.0, metavar="SECONDS",
                   help="stop starting builds that would end past this many seconds (default 450)")
    p.add_argument("--runs", type=int, default=None, help="timed calls per variant (default 100; quick 10)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls per variant (default 10; quick 2)")
    p.add_argument("--no-cudnn-benchmark", dest="cudnn_benchmark", action="store_false",
                   help="leave torch.backends.cudnn.benchmark off (default: on for every variant)")
    p.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                   help="write one table from earlier runs' engine-speed.json files (runs nothing)")
    args = p.parse_args(argv)
    if args.merge:
        return args
    quick = args.quick
    args.models = args.models or (["tiny"] if quick else ["resnet50"])
    args.batches = args.batches or ([1] if quick else [32, 1])
    args.levels = args.levels if args.levels is not None else ([0, 3] if quick else [0, 3, 5])
    args.precisions = args.precisions or (["fp32"] if quick else ["fp16"])
    args.baselines = args.baselines if args.baselines is not None else (
        ["eager", "compile"] if quick else ["eager", "compile", "max-autotune"])
    args.runs = args.runs or (10 if quick else 100)
    args.warmup = args.warmup or (2 if quick else 10)
    for name, values, known in (("--models", args.models, CANDIDATES), ("--precisions", args.precisions, DTYPES),
                                ("--baselines", args.baselines, ("eager", "compile", "max-autotune", "compile-plain"))):
        unknown = [v for v in values if v not in known]
        if unknown:
            p.error(f"{name}: unknown {unknown}; known: {sorted(known)}")
    if any(not 0 <= level <= 5 for level in args.levels):
        p.error(f"--levels must be in 0..5, got {args.levels}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU here (use --device cpu --quick)")
    if args.device == "cpu" and any(p_ in ("fp16", "bf16", "tf32") for p_ in args.precisions):
        p.error("--device cpu runs fp32 only (half precision is emulated on CPUs)")
    for precision in args.precisions:
        peak_precision(precision)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows, meta = merge(args.merge) if args.merge else run(args)
    text = markdown(rows, meta, meta.get("device_kind", args.device))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine-speed.md").write_text(text)
    (args.out / "engine-speed.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
