"""One variant of ``benchmarks/engine_speed.py``, measured in a child process: models, build, timing, one row.

``engine_speed.py --worker SPEC RESULT`` runs :func:`worker_main`: it makes the model (seeded, so
every child builds the same weights), its inputs (4 fresh ``randn`` batches, seeded by the batch
size) and the eager fp32 reference, builds the variant (a StreamRT plan at a level, or a
torch.compile mode), times it and writes one row as JSON. Nothing is shared between children, so a
child killed at its deadline takes its GPU memory and its Inductor workers with it.

Timing: CUDA events around each call on the current stream after warm-up, the median of
``runs`` calls, inputs rotated over the 4 batches; on the CPU ``perf_counter``. The roofline
fraction is :class:`streamrt.profiling.roofline.Roofline`'s (FLOPs of the batch counted by
``FlopCounterMode`` over the median time, against the datasheet peak of the precision).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from first_call import measure_in_fresh_process
from speed_lanes import DONE as GATE_DONE
from speed_lanes import wait_for_gate
from streamrt.testing.zoo import measure_batch_norm

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}
PAIRS = {"L0": "compile", "L1": "compile", "L2": "compile", "L3": "compile", "L4": "max-autotune",
         "L5": "max-autotune", "L4r": "max-autotune", "L5r": "max-autotune", "L4w": "max-autotune",
         "L5w": "max-autotune"}
"""The torch.compile variant each StreamRT level is compared with (same CUDA-graph use, same tuning effort).
``L5r`` is level 5 built again right after ``L5`` into the same timing cache (the warm rebuild); ``L5w`` the
same with new weights (a retrained model: the package cache misses, the timing cache answers)."""
BASELINES = ("eager", "compile", "max-autotune", "compile-plain")


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
    "vit": [("timm vit_tiny_patch16_224", _timm("vit_tiny_patch16_224"), (3, 224, 224)),
            ("torchvision vit_b_16", _torchvision("vit_b_16"), (3, 224, 224)),
            ("StreamRT zoo ViTLike (2 layers, 32x32)", _zoo("vit"), (3, 32, 32))],
    "tiny": [("StreamRT zoo MTCNNPNet (3 convs, 2 outputs)", _zoo("mtcnn"), (3, 48, 48))],
}


_PLAN = re.compile(r"L(\d)([csi]?)([bn]?)([rw]?)")
EPILOGUES: dict[str, str | None] = {"": None, "i": "inductor", "c": "cudnn", "s": "cudnn_spatial"}
"""Plan variant suffixes: a plain ``L5`` is level 5 as a user gets it (the level's own ``conv_epilogues``:
cuDNN's at level 5 on CUDA since 2026-12-04); ``L5i`` is level 5 with Inductor's epilogue kernels (what a plain
``L5`` meant in the tables up to 2026-12-05), ``L5c`` with ``conv_epilogues=cudnn``, ``L5s`` with
``cudnn_spatial`` (below level 5 ``c``/``s`` also turn freezing on, which folds batch norm so the pattern
appears)."""
BENCHMARK = {"": None, "b": True, "n": False}
"""Then ``b`` / ``n``: cuDNN benchmark mode forced on / off (``cudnn_benchmark``; none: the level's default)."""


def level_of(variant: str) -> int | None:
    """The optimization level of a plan variant (``L5``, ``L5c``/``L5s`` with cuDNN epilogues, ``L5r`` for a
    warm rebuild); ``None`` for torch's."""
    match = _PLAN.fullmatch(variant)
    return int(match.group(1)) if match else None


def epilogues_of(variant: str) -> str | None:
    """The ``conv_epilogues`` option of a plan variant (``None`` without a suffix: the level's default)."""
    match = _PLAN.fullmatch(variant)
    return EPILOGUES[match.group(2)] if match else None


def benchmark_of(variant: str) -> bool | None:
    """The ``cudnn_benchmark`` option of a plan variant (``L5cn``: off, ``L5cb``: on; None: the level's default)."""
    match = _PLAN.fullmatch(variant)
    return BENCHMARK[match.group(3)] if match else None


def base_variant(variant: str) -> str:
    """The variant without its epilogue and benchmark suffixes (``L5cnr`` -> ``L5r``): the key of pairs, priors
    and deadlines."""
    match = _PLAN.fullmatch(variant)
    return f"L{match.group(1)}{match.group(4)}" if match else variant


def make_model(key: str) -> Model:
    """The model ``key`` from its first source that imports (torchvision, then timm, then the repo's)."""
    errors = []
    for source, make, shape in CANDIDATES[key]:
        try:
            torch.manual_seed(0)
            return Model(key, measure_batch_norm(make(), shape), shape, source)
        except ImportError as exc:
            errors.append(f"{source}: {exc}")
    raise RuntimeError(f"no source for model {key}: {'; '.join(errors)}")


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


def output_count(out: Any) -> int:
    """How many outputs a module returns (a tensor is one)."""
    return 1 if isinstance(out, torch.Tensor) else len(out)


def plan_config(precision: str, level: int, device: str, build_budget_s: float | None,
                conv_epilogues: str | None = None, cudnn_benchmark: bool | None = None) -> Any:
    """The BuildConfig of a plan: TF32 through ``BuildConfig.tf32``, the build budget where given, the
    convolution epilogues only where the variant names them (``None``: the level's default, what
    ``streamrt build --optimization-level N`` gives), cuDNN's with freezing below level 5."""
    from streamrt.config import BuildConfig

    options: dict[str, Any] = {"device": device}
    if conv_epilogues is not None:
        options["conv_epilogues"] = conv_epilogues
    if conv_epilogues not in (None, "inductor") and level < 5:
        options["freezing"] = True
    if cudnn_benchmark is not None:
        options["cudnn_benchmark"] = cudnn_benchmark
    extra: dict[str, Any] = {}
    if precision == "tf32":
        extra["tf32"] = True
    if build_budget_s is not None:
        extra["build_budget_s"] = build_budget_s if build_budget_s > 0 else None
    return BuildConfig(backend="torch_inductor", precision="fp32" if precision == "tf32" else precision,
                       optimization_level=level, keep_io_types=False, backend_options=options, **extra)


# --- one variant -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    """What one child measures (written by the parent as JSON)."""

    model: str
    precision: str
    batch: int
    variant: str
    device: str
    runs: int
    warmup: int
    scratch: str
    cudnn_benchmark: bool = True
    build_budget_s: float | None = None
    timing_cache: str | None = None
    rebuild: bool = False
    gate: str | None = None  # the GPU gate's go file (speed_lanes): wait for it before the timed runs
    fresh_first_call: bool = False  # also time the plan's load and first call in a new process (first_call.py)

    def row(self) -> dict[str, Any]:
        return {"model": self.model, "precision": self.precision, "batch": self.batch, "variant": self.variant}


FRESH_TIMEOUT_S = 240.0
"""How long a fresh process may take to load a plan and answer twice (``--fresh-first-call``)."""


def _plan_fn(spec: Spec, model: Model, x: list[torch.Tensor], row: dict[str, Any],
             cleanup: list[Callable[[], None]]) -> Callable[[torch.Tensor], Any]:
    from streamrt import load
    from streamrt.building.module_builder import build_module

    level = level_of(spec.variant)
    assert level is not None
    config = plan_config(spec.precision, level, spec.device, spec.build_budget_s, epilogues_of(spec.variant),
                         benchmark_of(spec.variant))
    if spec.timing_cache:
        config = config.replace(timing_cache=Path(spec.timing_cache))
    elif spec.variant[-1] in "rw" or spec.rebuild:  # L5c and its rebuilds L5cr/L5cw share one
        config = config.replace(timing_cache=Path(spec.scratch) / f"timing-{spec.model}-{spec.precision}-b{spec.batch}"
                                f"-{spec.variant[:-1] if spec.variant[-1] in 'rw' else spec.variant}")
    with torch.no_grad():
        names = [f"out{i}" for i in range(output_count(model.net(x[0][:1].float())))]
    tag = f"{spec.model}-{spec.precision}-b{spec.batch}-{spec.variant}"
    scratch = Path(spec.scratch)
    t0 = time.perf_counter()
    built = build_module(model.net, [x[0]], scratch / f"{tag}.plan", config, input_names=["input"],
                         output_names=names, cache_dir=scratch / f"cache-{tag}",
                         progress=lambda line: print(f"build: {line}", flush=True))
    row["build_s"] = time.perf_counter() - t0
    backend = built.manifest.build_settings.get("backend", {})
    budget = backend.get("build_budget") or {}
    cache = backend.get("timing_cache") or {}
    # "package": "reused" when the plan's packages came from the timing cache's package cache (a warm L5r).
    row["timing_cache"] = {"hits": cache.get("hits"), "misses": cache.get("misses"), "package": cache.get("package")}
    row["build_budget"] = budget
    notes = [f"timing cache {cache.get('hits')} hits, {cache.get('misses')} misses"
             + (f", package {cache['package']}" if cache.get("package") else "")]
    for event in budget.get("fell_back") or []:
        notes.append(f"build budget {budget.get('seconds'):g} s: {event.get('what')} -> {event.get('to')} "
                     f"after {event.get('after_s')} s")
    # the build's shape verification (first calls of the plan, cuDNN's benchmark mode included): on the H200
    # (2026-12-04) a level-5 rebuild that compiled nothing spent 64.8 of its 67.8 s there
    verify_s = (built.manifest.extra.get("shape_verification") or {}).get("seconds")
    row["verify_s"] = verify_s
    if verify_s is not None:
        notes.append(f"verification {verify_s:.1f} s")
    if spec.fresh_first_call:
        fresh = measure_in_fresh_process(built.path, {"input": [spec.batch, *model.shape]}, FRESH_TIMEOUT_S)
        row["fresh"] = fresh
        notes.append(f"fresh process: {fresh['error']}" if "error" in fresh else
                     f"fresh process: load {fresh['load_s']:.1f} s, first call {fresh['first_call_s']:.1f} s, "
                     f"second {fresh['second_call_ms']:.2f} ms")
    row["notes"] = "; ".join(notes)
    engine = load(built.path)
    ctx = engine.create_context()
    cleanup += [ctx.close, engine.close]
    row["graphs"] = bool(getattr(ctx, "cuda_graph", False))
    from streamrt.backends.torch_inductor.tf32 import set_tf32

    set_tf32(spec.precision == "tf32")  # loading a plan set TF32 for it: same value, stated again

    def fn(t: torch.Tensor) -> Any:
        return ctx.infer({"input": t})[names[0]]

    return fn


def new_weights(net: torch.nn.Module, seed: int = 1) -> None:
    """Every floating parameter and buffer of ``net`` scaled by its own factor in [0.95, 1.05] (in place): the
    same shapes with other bytes, as after retraining, so a rebuild finds no compiled package of the first
    build but every autotuning result of its timing cache (``L5w``); batch-norm variances stay positive."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for tensor in [*net.parameters(), *net.buffers()]:
            if tensor.is_floating_point() and tensor.numel():
                tensor.mul_(1 + 0.1 * (torch.rand((), generator=gen).item() - 0.5))


def _torch_fn(spec: Spec, model: Model, x: list[torch.Tensor], row: dict[str, Any]) -> Callable[[torch.Tensor], Any]:
    net = copy.deepcopy(model.net).to(device=spec.device, dtype=DTYPES[spec.precision])
    if spec.variant == "eager":
        row["graphs"] = False
        return net
    mode = {"compile": "reduce-overhead" if spec.device == "cuda" else None, "compile-plain": None,
            "max-autotune": "max-autotune"}[spec.variant]
    compiled: Any = torch.compile(net, mode=mode, dynamic=False)
    row["graphs"] = spec.device == "cuda" and mode is not None
    row["notes"] = f"torch.compile(mode={mode!r}, dynamic=False)"
    step = getattr(torch.compiler, "cudagraph_mark_step_begin", None) if row["graphs"] else None

    def fn(t: torch.Tensor) -> Any:
        if step is not None:
            step()
        return compiled(t)

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(spec.scratch) / f"compile-{spec.variant}-{os.getpid()}")
    with torch.no_grad():
        t0 = time.perf_counter()
        for i in range(3):  # compile, then (reduce-overhead) warm up and record the graph
            fn(x[i % len(x)])
        _sync(spec.device)
        row["build_s"] = time.perf_counter() - t0
    return fn


def measure(spec: Spec) -> dict[str, Any]:
    """Build and time one variant; the row with its derived columns (images/s, roofline, rel. L2)."""
    from streamrt.backends.torch_inductor.tf32 import set_tf32
    from streamrt.profiling.flops import count_flops
    from streamrt.profiling.peaks import peaks_for
    from streamrt.profiling.roofline import Roofline

    device = spec.device
    if device == "cuda":
        torch.backends.cudnn.benchmark = spec.cudnn_benchmark
    else:
        # On a small shared CPU the compile worker pool's start-up costs more than it saves.
        import torch._inductor.config as inductor_config

        from streamrt.device.threads import resolve_cpu_threads

        inductor_config.compile_threads = 1
        torch.set_num_threads(resolve_cpu_threads(None))
    model = make_model(spec.model)
    model.net.to(device)
    if level_of(spec.variant) is not None and spec.variant.endswith("w"):  # before the fp32 reference is taken
        new_weights(model.net)
    gen = torch.Generator(device="cpu").manual_seed(spec.batch)
    inputs = [torch.randn(spec.batch, *model.shape, generator=gen).to(device) for _ in range(4)]
    flops = count_flops(model.net, [inputs[0]])
    set_tf32(False)
    with torch.no_grad():
        ref = first_tensor(copy.deepcopy(model.net).float()(inputs[0])).clone()
    row: dict[str, Any] = {**spec.row(), "source": model.source, "input": list(model.shape),
                           "gflop_per_image": flops.per_item / 1e9, "torch": torch.__version__,
                           "device_name": torch.cuda.get_device_name() if device == "cuda"
                           else f"CPU ({platform.processor() or platform.machine()})"}
    x = [t.to(DTYPES[spec.precision]) for t in inputs]
    set_tf32(spec.precision == "tf32")
    cleanup: list[Callable[[], None]] = []
    print(f"building {spec.variant}", flush=True)
    plan = level_of(spec.variant) is not None
    fn = _plan_fn(spec, model, x, row, cleanup) if plan else _torch_fn(spec, model, x, row)
    waited = wait_for_gate(spec.gate, lambda line: print(line, flush=True))
    print(f"timing {spec.variant}: {spec.warmup} warm-up + {spec.runs} runs", flush=True)
    try:
        with torch.no_grad():
            ms = median_ms(fn, x, spec.runs, spec.warmup, device)
            out = first_tensor(fn(x[0])).clone()
            _sync(device)
    finally:
        if spec.gate:
            print(GATE_DONE, flush=True)
        for close in cleanup:
            close()
    if waited:
        row["notes"] = "; ".join(n for n in (row.get("notes"), waited) if n)
    peaks = peaks_for(torch.cuda.get_device_name()) if device == "cuda" else None
    roof = Roofline(flops, peaks, spec.precision, wall_ms=ms, kernel_ms=0.0)
    row.update(ms=ms, images_per_s=spec.batch / ms * 1e3, rel_l2=rel_l2(out, ref), status="ok")
    if roof.fraction_of_peak is not None:
        row["roofline"] = roof.fraction_of_peak
    return row


def worker_main(spec_path: Path, result_path: Path) -> int:
    """The child's job: measure the spec, write the row (or the failure) to ``result_path``."""
    from streamrt.backends.torch_inductor.deadline import watch_parent

    spec = Spec(**json.loads(Path(spec_path).read_text()))
    with watch_parent():
        try:
            row = measure(spec)
        except Exception as exc:  # reported as the row's note; the parent goes on with the next variant
            row = {**spec.row(), "status": "failed", "notes": f"failed: {type(exc).__name__}: {str(exc)[:300]}"}
            print(row["notes"], file=sys.stderr, flush=True)
    Path(result_path).write_text(json.dumps(row))
    return 0


def spec_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(Spec)}
