"""GPU engine backend without TensorRT: torch.export + AOTInductor packages.

Build: ONNX -> StreamRT's importer (an ``nn.Module``) -> ``torch.export`` with dynamic dims
from each shape profile -> ``aoti_compile_and_package`` (fused, optionally autotuned kernels
for this GPU, or C++ kernels on CPU) -> one ``.pt2`` package per profile, stored together in
the plan's payload. The opt shape of a profile is the example input the kernels are tuned for.

Load: packages are extracted to a private directory and loaded with
``torch._inductor.package.load_package``; each execution context gets its own runner (so
contexts on different streams never contend for one model container's lock), which
duplicates the weights per context: keep contexts few for large models.

A plan records torch, CUDA and GPU architecture; loading it elsewhere fails with the standard
mismatch message. See ``docs/gpu-backend.md``.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import io
import json
import logging
import os
import platform
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from streamrt.backends.base import Backend, BuildJob, BuildOutput, Engine, Progress
from streamrt.config import BuildConfig, default_cache_dir
from streamrt.errors import BuildError, ConfigError
from streamrt.plan import Plan, PlanManifest, check_field
from streamrt.types import ShapeProfile

__all__ = ["TorchInductorBackend", "build_module", "device_target", "export_profiles", "module_sha256"]

log = logging.getLogger(__name__)

_OPTIONS = {"device", "max_autotune", "freezing", "cuda_graphs", "coordinate_descent_tuning", "threads"}


def device_target(kind: str) -> dict[str, Any]:
    """What a package is tied to: GPU name, compute capability and CUDA version, or the CPU ISA."""
    if kind == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {
            "kind": "cuda",
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "cuda": str(torch.version.cuda),
        }
    from streamrt.backends.onnxruntime import _cpu_isa

    return {"kind": "cpu", "arch": platform.machine(), "isa": _cpu_isa()}


def _device_kind(config: BuildConfig) -> str:
    wanted = str(config.backend_options.get("device", "auto"))
    if wanted not in ("auto", "cuda", "cpu"):
        raise ConfigError(f"torch_inductor option device must be auto, cuda or cpu, got {wanted!r}")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ConfigError("torch_inductor device=cuda was asked for but torch sees no CUDA GPU")
    if wanted == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return wanted


def _threads_option(config: BuildConfig) -> int:
    """CPU plans' intra-op threads; 0 means the load-aware default decided when a context is created."""
    value = config.backend_options.get("threads", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"torch_inductor option threads must be an integer >= 0 (0 = automatic), got {value!r}")
    return value


def _example_size(lo: int, opt: int, hi: int) -> int:
    # torch.export specialises a dynamic dim whose example size is 0 or 1 (pytorch#133653):
    # use 2 where the range allows it; kernels are then tuned for 2 instead of 1.
    return 2 if opt <= 1 and hi >= 2 else opt


def _export_max(lo: int, hi: int) -> int:
    # A range 1..2 traced at 2 is inferred static ("tracing inferred a static shape of 2"): torch
    # reasons about sizes as >= 2, which leaves one value. Export 1..3; the profile still
    # refuses 3 at run time.
    return 3 if lo <= 1 and hi == 2 else hi


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
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        raise BuildError(
            f"torch.export failed: {type(exc).__name__}: {' '.join(lines[:3])[:400]}",
            hint="narrow the shape profile, or report the model's failing operator",
        ) from exc


def _inductor_configs(config: BuildConfig, metadata: Mapping[str, str], kind: str = "cuda") -> dict[str, Any]:
    opts = config.backend_options
    autotune = bool(opts.get("max_autotune", config.optimization_level >= 4))
    configs = {
        "max_autotune": autotune,
        "coordinate_descent_tuning": bool(opts.get("coordinate_descent_tuning", config.optimization_level >= 5)),
        "freezing": bool(opts.get("freezing", False)),
        "aot_inductor.metadata": dict(metadata),
    }
    if kind == "cpu":
        # C++ kernels read the team size at run time (the engine's thread policy), instead of
        # baking in the build machine's thread count.
        configs["cpp.dynamic_threads"] = True
    return configs


@contextlib.contextmanager
def inductor_cache(cache_dir: Path) -> Iterator[None]:
    """Inductor's compile cache under ``cache_dir/inductor`` for the duration of a build.

    A ``TORCHINDUCTOR_CACHE_DIR`` the user set wins; otherwise the variable is set and restored.
    """
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    try:
        yield
    finally:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)


def compile_package(ep: torch.export.ExportedProgram, inductor_configs: Mapping[str, Any]) -> bytes:
    """AOTInductor-compile one exported program and return the ``.pt2`` bytes."""
    from torch._inductor import aoti_compile_and_package

    with tempfile.TemporaryDirectory(prefix="streamrt-aoti-") as tmp:
        path = Path(tmp) / "model.pt2"
        try:
            aoti_compile_and_package(ep, package_path=str(path), inductor_configs=dict(inductor_configs))
        except Exception as exc:
            raise BuildError(
                f"AOTInductor compilation failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:400]}",
                hint="try --opt-level 3 (no autotuning); check that g++ (and CUDA headers) exist",
            ) from exc
        return path.read_bytes()


def pack_payload(packages: Sequence[bytes], meta: Mapping[str, Any]) -> bytes:
    """One zip (stored, uncompressed) holding ``profile_<i>.pt2`` per profile and ``meta.json``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("meta.json", json.dumps(dict(meta), sort_keys=True))
        for i, data in enumerate(packages):
            zf.writestr(f"profile_{i}.pt2", data)
    return buffer.getvalue()


def set_tf32(enabled: bool) -> None:
    """TF32 tensor-core math for fp32 matmuls and cuDNN convolutions on (tf32) or off (fp32, IEEE).

    Process-wide torch state, set when a plan is built or loaded. It is always set explicitly:
    torch enables TF32 for cuDNN convolutions by default, which put fp32 plans 2-3e-4 (relative
    L2) away from an fp32 reference on the H200. The legacy ``allow_tf32`` flags are used on
    purpose: torch.export (2.11-2.13) reads them internally and raises once the newer
    ``fp32_precision`` API has set conv and RNN flags, so the two APIs cannot be mixed here.
    """
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


class TorchInductorBackend(Backend):
    """Builds AOTInductor packages (GPU or CPU) and loads them into engines."""

    name = "torch_inductor"
    extra = "torch"
    precisions = frozenset({"fp32", "tf32", "fp16", "bf16", "int8"})
    _CUDA_FIELDS = ("kind", "name", "compute_capability", "cuda")
    _CPU_FIELDS = ("kind", "arch", "isa")

    def version(self) -> str:
        return str(torch.__version__)

    def runtime_versions(self) -> dict[str, str]:
        versions = {"torch": self.version(), "cuda": str(torch.version.cuda)}
        try:
            import triton

            versions["triton"] = str(triton.__version__)
        except ImportError:
            pass
        return versions

    def target(self, config: BuildConfig) -> dict[str, Any]:
        return device_target(_device_kind(config))

    def check_compatible(self, manifest: PlanManifest) -> None:
        check_field(manifest, "torch version", manifest.backend_version, self.version())
        kind = str(manifest.device.get("kind"))
        if kind == "cuda" and not torch.cuda.is_available():
            check_field(manifest, "device.kind", "cuda", "cpu (no CUDA GPU visible to torch)")
        local = device_target(kind)
        for key in self._CUDA_FIELDS if kind == "cuda" else self._CPU_FIELDS:
            check_field(manifest, f"device.{key}", manifest.device.get(key), local.get(key))

    def build(self, job: BuildJob) -> BuildOutput:
        from streamrt.onnx.importer import import_onnx

        model, config = job.model, job.config
        unknown = sorted(set(config.backend_options) - _OPTIONS)
        if unknown:
            raise ConfigError(f"unknown torch_inductor options {unknown}; known: {sorted(_OPTIONS)}")
        kind = _device_kind(config)
        job.progress(f"importing ONNX into torch ({len(model.proto.graph.node)} nodes)")
        module = import_onnx(model.proto).eval().to(kind)
        names = [s.name for s in model.inputs]
        dtypes = [s.dtype.torch for s in model.inputs]
        with inductor_cache(job.cache_dir):
            return self._build_module(module, names, dtypes, config, job.profiles, job.progress, kind)

    def _build_module(
        self,
        module: torch.nn.Module,
        names: Sequence[str],
        dtypes: Sequence[torch.dtype],
        config: BuildConfig,
        profiles: tuple[ShapeProfile, ...],
        progress: Progress,
        kind: str,
    ) -> BuildOutput:
        threads = _threads_option(config)  # checked before the long compile
        set_tf32(config.precision.value == "tf32")
        meta = {"streamrt.inputs": ",".join(names), "streamrt.precision": config.precision.value}
        inductor_configs = _inductor_configs(config, meta, kind)
        packages = []
        with torch.inference_mode(False), torch.no_grad():
            for i, profile in enumerate(profiles):
                progress(f"profile {i + 1}/{len(profiles)}: torch.export with {len(names)} inputs")
                ep = export_profiles(module, names, dtypes, profile, kind)
                tuned = "autotuning kernels" if inductor_configs["max_autotune"] else "compiling kernels"
                progress(f"profile {i + 1}/{len(profiles)}: AOTInductor, {tuned} for {kind}")
                packages.append(compile_package(ep, inductor_configs))
        settings = {
            "device": kind,
            "inductor": {k: v for k, v in inductor_configs.items() if k != "aot_inductor.metadata"},
            # On unless asked otherwise: GPU plans are often launch-bound (see torch_inductor_engine).
            "cuda_graphs": bool(config.backend_options.get("cuda_graphs", True)),
            "threads": threads,
            "fp32_precision": "tf32" if config.precision.value == "tf32" else "ieee",
        }
        return BuildOutput(pack_payload(packages, {"inputs": list(names)}), settings=settings)

    def load(self, plan: Plan) -> Engine:
        from streamrt.backends.torch_inductor_engine import TorchInductorEngine

        return TorchInductorEngine(plan.manifest, plan.payload)


def module_sha256(module: torch.nn.Module) -> str:
    """Content hash of a module's weights and buffers (the "source model" of a module build)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    digest.update(type(module).__qualname__.encode())
    return digest.hexdigest()


class _CastIO(torch.nn.Module):
    """Runs a half-precision module behind fp32 inputs and outputs (keep_io_types)."""

    def __init__(self, inner: torch.nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.inner = inner
        self.dtype = dtype

    def forward(self, *args: torch.Tensor) -> Any:
        cast = [a.to(self.dtype) if a.is_floating_point() else a for a in args]
        out = self.inner(*cast)
        if isinstance(out, torch.Tensor):
            return out.float()
        return tuple(o.float() if o.is_floating_point() else o for o in out)


def build_module(
    module: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    output: str | Path,
    config: BuildConfig | None = None,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    progress: Progress | None = None,
    cache_dir: str | Path | None = None,
) -> Path:
    """Build a torch_inductor plan straight from a PyTorch module, for users who start in PyTorch.

    Shapes come from ``config.profiles`` (by input name) or, when there are none, are static at
    the example inputs' shapes. fp16/bf16 cast the module's weights (inputs and outputs stay
    fp32 when ``keep_io_types``); int8 is only available through the ONNX path.

    Example:
        >>> build_module(net, [torch.randn(8, 3, 224, 224)], "net.plan",
        ...              BuildConfig(backend="torch_inductor", precision="fp16"))      # doctest: +SKIP
    """
    from streamrt.builder import make_manifest
    from streamrt.onnx.profiles import resolve_profiles
    from streamrt.plan import write_plan
    from streamrt.types import DType, TensorSpec

    config = config or BuildConfig(backend="torch_inductor")
    if config.backend != "torch_inductor":
        config = config.replace(backend="torch_inductor")
    if config.precision.value == "int8":
        raise ConfigError("int8 from a PyTorch module is not supported; export to ONNX and build with --calib")
    report = progress or (lambda line: log.info("%s", line))
    kind = _device_kind(config)
    names = list(input_names or [f"input_{i}" for i in range(len(example_inputs))])
    inputs = tuple(
        TensorSpec(n, DType.from_any(t.dtype), tuple(t.shape)) for n, t in zip(names, example_inputs, strict=True)
    )
    if config.profiles:
        dynamic_axes = {
            name: {a for a, (lo, hi) in enumerate(zip(r.min, r.max, strict=True)) if lo != hi}
            for p in config.profiles
            for name, r in p.ranges.items()
        }
        inputs = tuple(
            TensorSpec(
                s.name,
                s.dtype,
                tuple(-1 if a in dynamic_axes.get(s.name, ()) else d for a, d in enumerate(s.shape)),
            )
            for s in inputs
        )
    profiles = resolve_profiles(inputs, config.profiles or ())
    # A copy: casting to fp16/bf16 or moving devices must not change the caller's module.
    net: torch.nn.Module = copy.deepcopy(module).eval().to(kind)
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(config.precision.value)
    if half is not None:
        net = net.to(half)
        if config.keep_io_types:
            net = _CastIO(net, half)
    if half is not None and not config.keep_io_types:
        example_inputs = [t.to(half) if t.is_floating_point() else t for t in example_inputs]
        inputs = tuple(
            TensorSpec(s.name, DType.from_any(t.dtype), s.shape) for s, t in zip(inputs, example_inputs, strict=True)
        )
    with torch.no_grad():
        outs = net(*[t.to(kind) for t in example_inputs])
    outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
    onames = list(output_names or [f"output_{i}" for i in range(len(outs))])
    outputs = tuple(TensorSpec(n, DType.from_any(o.dtype), tuple(o.shape)) for n, o in zip(onames, outs, strict=True))
    dtypes = [t.dtype for t in example_inputs]
    backend = TorchInductorBackend()
    with inductor_cache(Path(cache_dir) if cache_dir is not None else default_cache_dir()):
        built = backend._build_module(net, names, dtypes, config, profiles, report, kind)
    out_path = Path(output)
    manifest = make_manifest(
        backend.name,
        device_target(kind),
        config,
        built,
        inputs,
        outputs,
        profiles,
        source_sha256=module_sha256(module),
        source_name=type(module).__qualname__,
        build_command=f"streamrt.build_module({type(module).__qualname__}, ...) from your PyTorch code",
    )
    write_plan(out_path, manifest, built.payload)
    report(f"wrote {out_path} ({out_path.stat().st_size / 2**20:.2f} MiB)")
    return out_path
