"""GPU engine backend without TensorRT, build side: torch.export + AOTInductor packages.

Build: ONNX -> StreamRT's importer (an ``nn.Module``) -> ``torch.export`` with dynamic dims
from each shape profile -> ``aoti_compile_and_package`` (fused, optionally autotuned kernels
for this GPU, or C++ kernels on CPU) -> one ``.pt2`` package per profile, stored together in
the plan's payload. The opt shape of a profile is the example input the kernels are tuned for.

Only :class:`.backend.TorchInductorBackend`'s ``build`` and ``build_from_module`` import this
module (and :mod:`._compile_child`, the deadline's child process); loading a plan never does.
See ``docs/gpu-backend.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import re
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from streamrt.backends.base import BuildJob, BuildOutput, Progress
from streamrt.backends.torch_inductor.budget import BuildBudget, tunes
from streamrt.backends.torch_inductor.cache import (
    TimingCacheStats,
    count_autotuning,
    inductor_cache,
    settle_triton_ptxas,
    timing_cache,
)
from streamrt.backends.torch_inductor.heartbeat import with_heartbeat
from streamrt.backends.torch_inductor.levels import EPILOGUE_KNOB, Recipe, layout_knobs, resolve_recipe
from streamrt.backends.torch_inductor.memory_format import choose_memory_format, has_convolutions
from streamrt.backends.torch_inductor.output_specs import (
    CompiledOutput,
    exported_outputs,
    merge_profiles,
    refine_declared,
)
from streamrt.backends.torch_inductor.package_cache import PackageCache
from streamrt.backends.torch_inductor.payload import pack_payload
from streamrt.backends.torch_inductor.target import cpu_target_note, device_kind, device_target, runtime_versions
from streamrt.backends.torch_inductor.tf32 import backend_flags
from streamrt.config import BuildConfig
from streamrt.errors import BuildError, ConfigError
from streamrt.types import ShapeProfile, TensorSpec

__all__ = [
    "build_from_module",
    "build_onnx",
    "compile_package",
    "export_profiles",
    "torch_warnings_logged",
    "warn_slow_cpu_precision",
]

log = logging.getLogger(__name__)

_OPTIONS = {
    "device", "max_autotune", "freezing", "cuda_graphs", "coordinate_descent_tuning", "threads", "memory_format",
    "conv_backends", "conv_epilogues", "cudnn_benchmark",
}


def _threads_option(config: BuildConfig) -> int:
    """CPU plans' intra-op threads; 0 means the load-aware default decided when a context is created."""
    value = config.backend_options.get("threads", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"torch_inductor option threads must be an integer >= 0 (0 = automatic), got {value!r}")
    return value


def warn_slow_cpu_precision(kind: str, precision: str) -> None:
    """Half precision on the CPU: Inductor emulates it, ONNX Runtime's fp32 kernels are far faster.

    Measured on a 2-core CPU (issue 16): a torch_inductor fp16 plan of the small CNN ran 80x slower
    than the onnxruntime plan of the same model. The build goes on (it may be a test of the GPU
    path); the warning names the faster choice.
    """
    if kind == "cpu" and precision in ("fp16", "bf16"):
        log.warning(
            "torch_inductor %s on the CPU is slow (about 80x slower than ONNX Runtime here: CPUs emulate "
            "half precision); for CPU inference use --backend onnxruntime (fp32 or int8), or build on a GPU machine",
            precision,
        )


def _example_size(lo: int, opt: int, hi: int) -> int:
    # torch.export specialises a dynamic dim whose example size is 0 or 1 (pytorch#133653):
    # use 2 where the range allows it; kernels are then tuned for 2 instead of 1.
    return 2 if opt <= 1 and hi >= 2 else opt


def _export_max(lo: int, hi: int) -> int:
    # A range 1..2 traced at 2 is inferred static ("tracing inferred a static shape of 2"): torch
    # reasons about sizes as >= 2, which leaves one value. Export 1..3; the profile still
    # refuses 3 at run time.
    return 3 if lo <= 1 and hi == 2 else hi


_SPECIALIZED = re.compile(r"L\['(\w+)'\]\.size\(\)\[(\d+)\].*?specialized it to be a constant \((\d+)\)", re.S)
_WHAT_TO_CHANGE = ("suggested fix", "inferred a static shape", "specialized it to be a constant")


def _export_failure(exc: Exception, names: Sequence[str]) -> tuple[str, str]:
    """torch.export's message on one line, keeping the part that says what to change, and a hint."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()] or [type(exc).__name__]
    keep = [lines[0][:400]]
    for i, line in enumerate(lines):
        if any(key in line.lower() for key in _WHAT_TO_CHANGE):
            keep += [part[:300] for part in lines[i: i + 3]]
            break
    hint = "change the shape profile (--min-shapes/--max-shapes), or report the model's failing operator"
    match = _SPECIALIZED.search(text)
    if match:
        arg, axis, size = match.groups()
        by_arg = {re.sub(r"\W", "_", n): n for n in names}
        name = by_arg.get(arg, arg)
        hint = (f"the model fixes axis {axis} of input '{name}' to {size}: build with that axis at {size} "
                f"in --min-shapes, --opt-shapes and --max-shapes")
    return " ".join(dict.fromkeys(keep))[:1200], hint


def export_profiles(
    module: torch.nn.Module,
    names: Sequence[str],
    dtypes: Sequence[torch.dtype],
    profile: ShapeProfile,
    device: str,
) -> torch.export.ExportedProgram:
    """``torch.export`` the module for one profile: ranges become ``Dim.DYNAMIC(min, max)``."""
    from torch.export import Dim

    generator = torch.Generator(device="cpu").manual_seed(0)
    examples = []
    dynamic: list[dict[int, Any] | None] = []
    for name, dtype in zip(names, dtypes, strict=True):
        rng = profile.ranges[name]
        shape = [_example_size(lo, o, hi) for lo, o, hi in zip(rng.min, rng.opt, rng.max, strict=True)]
        if dtype.is_floating_point:
            example = torch.randn(shape, generator=generator).to(dtype)
        else:
            example = torch.randint(0, 2, shape, generator=generator).to(dtype)
        examples.append(example.to(device))
        dims = {
            axis: Dim.DYNAMIC(min=lo, max=_export_max(lo, hi))
            for axis, (lo, hi) in enumerate(zip(rng.min, rng.max, strict=True))
            if lo != hi
        }
        dynamic.append(dims or None)
    shapes: Any = tuple(dynamic) if any(d is not None for d in dynamic) else None
    params = inspect.signature(module.forward).parameters.values()
    if shapes is not None and any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        shapes = (shapes,)  # torch.export matches `forward(*args)` against one nested entry
    try:
        return torch.export.export(module, tuple(examples), dynamic_shapes=shapes, strict=False)
    except Exception as exc:
        message, hint = _export_failure(exc, names)
        raise BuildError(f"torch.export failed: {type(exc).__name__}: {message}", hint=hint) from exc


@contextlib.contextmanager
def torch_warnings_logged() -> Iterator[None]:
    """torch's own deprecation warnings during a build stay off the user's terminal.

    torch.export and AOTInductor raise FutureWarnings about torch internals (pytree's ``LeafSpec``)
    that the user can do nothing about. They are ignored, not recorded: an earlier version recorded
    every warning under the "always" filter, and with it in place CUDA builds stalled on the H200
    (suspected: a warning in a hot loop made unbounded work; not confirmed). Others still show.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        log.debug("torch FutureWarning/DeprecationWarning ignored during the build")
        yield


def compile_package(ep: torch.export.ExportedProgram, inductor_configs: Mapping[str, Any]) -> bytes:
    """AOTInductor-compile one exported program and return the ``.pt2`` bytes.

    ``inductor_configs`` may carry :data:`.levels.EPILOGUE_KNOB` (the ``conv_epilogues`` mode): it is
    taken out and becomes the post-grad pass of :mod:`.conv_epilogues` during the compile."""
    from torch._inductor import aoti_compile_and_package

    from streamrt.backends.torch_inductor.conv_epilogues import installed
    from streamrt.backends.torch_inductor.vec_isa import recorded_check_builds

    settle_triton_ptxas()  # every compile process hashes Triton's backend alike (template candidates' cache keys)
    configs = dict(inductor_configs)
    epilogues = str(configs.pop(EPILOGUE_KNOB, "inductor"))
    with tempfile.TemporaryDirectory(prefix="streamrt-aoti-") as tmp:
        path = Path(tmp) / "model.pt2"
        try:
            # the CPU vector-ISA probe's test builds answered from this cache directory's record where it has them
            with installed(epilogues), recorded_check_builds():
                aoti_compile_and_package(ep, package_path=str(path), inductor_configs=configs)
        except Exception as exc:
            raise BuildError(
                f"AOTInductor compilation failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:400]}",
                hint="try --optimization-level 3 (no autotuning); check that g++ (and CUDA headers) exist",
            ) from exc
        return path.read_bytes()



def _compile_in_layout(
    budget: BuildBudget, ep: torch.export.ExportedProgram, configs: Mapping[str, Any], label: str,
    later: int, memory_format: str, optional: bool,
) -> bytes | None:
    return budget.compile(ep, {**configs, **layout_knobs(memory_format)}, label=f"{label} {memory_format}",
                          optional=optional, later=later)


def _describe(recipe: Recipe) -> str:
    knobs = recipe.inductor
    on = [name for name in ("max_autotune", "coordinate_descent_tuning", "freezing") if knobs.get(name)]
    if knobs.get("max_autotune"):
        on[0] += f" ({knobs.get('max_autotune_gemm_backends')})"
    if recipe.cudnn_benchmark:
        on.append("cudnn benchmark")
    if recipe.conv_epilogues != "inductor":
        on.append(f"convolution epilogues {recipe.conv_epilogues}")
    return f"{', '.join(on) or 'no autotuning'}; memory format {recipe.memory_format}"


def build_onnx(job: BuildJob) -> BuildOutput:
    """Import ``job.model`` into torch and build it (:func:`build_from_module`) in the build's Inductor cache."""
    from streamrt.onnx.importer import import_onnx

    model, config = job.model, job.config
    unknown = sorted(set(config.backend_options) - _OPTIONS)
    if unknown:
        raise ConfigError(f"unknown torch_inductor options {unknown}; known: {sorted(_OPTIONS)}")
    kind = device_kind(config)
    warn_slow_cpu_precision(kind, config.precision.value)
    job.progress(f"importing ONNX into torch ({len(model.proto.graph.node)} nodes)")
    module = import_onnx(model.proto).eval().to(kind)
    names = [s.name for s in model.inputs]
    dtypes = [s.dtype.torch for s in model.inputs]
    with inductor_cache(job.cache_dir):
        built = build_from_module(module, names, dtypes, config, job.profiles, job.progress, kind, job.started)
    # The graph's names and dtypes, with the dims the compiled program makes follow its inputs.
    return dataclasses.replace(built, outputs=refine_declared(model.outputs, built.outputs))


def build_from_module(
    module: torch.nn.Module,
    names: Sequence[str],
    dtypes: Sequence[torch.dtype],
    config: BuildConfig,
    profiles: tuple[ShapeProfile, ...],
    progress: Progress,
    kind: str,
    started: float | None = None,
) -> BuildOutput:
    """Export and compile an imported (or user) module, one ``.pt2`` per shape profile.

    The shared step of ONNX builds and :func:`streamrt.build_module`; the caller sets the
    Inductor cache (:func:`inductor_cache`) and has resolved ``kind`` and ``profiles``. The
    result's ``outputs`` (named ``output_<i>``) come from the exported programs' symbolic
    shapes (:mod:`.output_specs`): ``-1`` where an output follows a dynamic input. ``started``
    (``time.monotonic()``) is when the caller's build began: the build budget counts from there.
    """
    threads = _threads_option(config)  # checked before the long compile
    recipe = resolve_recipe(config, kind)
    note = cpu_target_note(config, kind)
    if note:
        progress(note)
    meta = {"streamrt.inputs": ",".join(names), "streamrt.precision": config.numeric_precision}
    progress(f"optimization level {recipe.level}: {_describe(recipe)}")
    budget = BuildBudget(config.build_budget_s, progress, compile_package, config.tf32, recipe.cudnn_benchmark,
                         started=time.monotonic() if started is None else started)
    with _timings(config, kind) as stats, backend_flags(config.tf32, recipe.cudnn_benchmark):
        if config.timing_cache is not None and not stats.ignored:
            budget.packages = PackageCache(config.timing_cache, _identity(kind),
                                           {"tf32": config.tf32, "cudnn_benchmark": recipe.cudnn_benchmark})
        packages, layout, exported = _compile(
            module, names, dtypes, recipe, meta, profiles, progress, kind, budget)
        stats.hits, stats.misses = stats.hits + budget.hits, stats.misses + budget.misses
        stats.packages = list(budget.outcomes) if budget.packages is not None else []
    for why in stats.missed:  # compiled here (a child's misses are said by the budget)
        progress(f"timing cache miss: {why}")
    progress(stats.line())
    epilogues = _epilogues_report(recipe, packages[0], progress) if recipe.conv_epilogues != "inductor" else None
    decided = layout_knobs(layout["memory_format"]) if layout else {}
    settings = {
        "device": kind,
        "inductor": dict(sorted({**recipe.inductor, **decided}.items())),
        "optimization": {**recipe.to_dict(), **({"memory_format_decision": layout} if layout else {})},
        "timing_cache": stats.to_dict(),
        "build_budget": budget.to_dict(),
        # On unless asked otherwise: GPU plans are often launch-bound (see engine.py).
        "cuda_graphs": bool(config.backend_options.get("cuda_graphs", True)),
        "threads": threads,
        "fp32_precision": "tf32" if config.tf32 else "ieee",
        "cudnn_benchmark": recipe.cudnn_benchmark,
        **({"conv_epilogues": epilogues} if epilogues else {}),
    }
    outputs = tuple(
        TensorSpec(f"output_{i}", dtype, shape) for i, (shape, dtype) in enumerate(merge_profiles(exported))
    )
    return BuildOutput(pack_payload(packages, {"inputs": list(names)}), settings=settings, outputs=outputs)

def _epilogues_report(recipe: Recipe, package: bytes, progress: Progress) -> dict[str, Any]:
    """What ``conv_epilogues`` fused in the first profile's package, said and recorded in the manifest."""
    from streamrt.backends.torch_inductor.conv_epilogues import fused_in_package

    fused = fused_in_package(package)
    if any(fused.values()):
        progress(f"convolution epilogues in cuDNN ({recipe.conv_epilogues}): {fused['conv_relu']} conv+ReLU, "
                 f"{fused['conv_add_relu']} conv+add+ReLU")
    else:
        progress(f"convolution epilogues {recipe.conv_epilogues}: no convolution matched (batch norm is folded "
                 "only with freezing: level 5 or --option freezing=true; channels must be multiples of 8)")
    return {"mode": recipe.conv_epilogues, "fused": fused}


def _identity(kind: str) -> dict[str, Any]:
    """What a timing cache and its packages were made on: the GPU's name or the CPU's ISA, and the versions."""
    return {"device": device_target(kind).get("name" if kind == "cuda" else "isa"), **runtime_versions()}


def _timings(config: BuildConfig, kind: str) -> contextlib.AbstractContextManager[TimingCacheStats]:
    """The explicit ``--timing-cache`` directory, or counting in the current Inductor cache."""
    if config.timing_cache is not None:
        return timing_cache(config.timing_cache, _identity(kind))
    return count_autotuning(TimingCacheStats(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "inductor default")))

def _compile(
    module: torch.nn.Module,
    names: Sequence[str],
    dtypes: Sequence[torch.dtype],
    recipe: Recipe,
    meta: Mapping[str, str],
    profiles: tuple[ShapeProfile, ...],
    progress: Progress,
    kind: str,
    budget: BuildBudget,
) -> tuple[list[bytes], dict[str, Any] | None, list[list[CompiledOutput]]]:
    """One package per profile, and each profile's exported outputs (:func:`.output_specs.exported_outputs`).

    At ``memory_format=measure`` profile 0 decides the layout for all. Autotuning compiles run
    under ``budget`` (:mod:`.budget`): the level-3 recipe first, then autotuning in a child with
    the rest of the budget as its deadline (both report their own progress); other compiles run
    here behind a heartbeat."""
    configs = {**recipe.inductor, "aot_inductor.metadata": dict(meta)}
    if recipe.conv_epilogues != "inductor":
        configs[EPILOGUE_KNOB] = recipe.conv_epilogues
    packages, layout = [], None
    exported: list[list[CompiledOutput]] = []
    with torch.inference_mode(False), torch.no_grad(), torch_warnings_logged():
        for i, profile in enumerate(profiles):
            progress(f"profile {i + 1}/{len(profiles)}: torch.export with {len(names)} inputs")
            ep = export_profiles(module, names, dtypes, profile, kind)
            exported.append(exported_outputs(ep))
            later = len(profiles) - i - 1  # required compiles after this one: the budget keeps their level-3 time
            tuned = "autotuning kernels" if configs["max_autotune"] else "compiling kernels"
            step = f"profile {i + 1}/{len(profiles)}: AOTInductor, {tuned} for {kind}"
            progress(step)
            if recipe.memory_format == "measure" and layout is None:
                if not has_convolutions(ep):
                    layout = {"memory_format": "inductor", "reason": "no convolutions"}
                else:
                    choose = functools.partial(
                        choose_memory_format, ep,
                        functools.partial(_compile_in_layout, budget, ep, configs, f"profile {i + 1}", later),
                        kind, progress,
                    )
                    choice = choose() if tunes(configs) else with_heartbeat(choose, progress, step)
                    layout = choice.to_dict()
                    configs.update(layout_knobs(choice.memory_format))
                    packages.append(choice.package)
                    continue
            compile_step = functools.partial(budget.compile, ep, configs, label=f"profile {i + 1}/{len(profiles)}",
                                             later=later)
            package = compile_step() if tunes(configs) else with_heartbeat(compile_step, progress, step)
            assert package is not None  # only optional compiles are skipped
            packages.append(package)
    return packages, layout, exported
