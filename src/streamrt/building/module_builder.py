"""``streamrt.build_module``: a torch_inductor plan straight from a PyTorch module.

For users who start in PyTorch: the module (a copy, cast to the plan's precision) goes through
the torch_inductor backend's export-and-compile step, and the plan gets the same manifest as an
ONNX build, with the weights' hash as its source model. Before it is written the plan is verified
at its profiles' corners against the eager module in fp32 (:mod:`streamrt.building.verify`), as ONNX
builds are against ONNX Runtime.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from streamrt._oom import BUILD_HINT, out_of_memory_guard
from streamrt.backends.base import Progress
from streamrt.backends.torch_inductor.backend import TorchInductorBackend
from streamrt.backends.torch_inductor.cache import inductor_cache
from streamrt.backends.torch_inductor.output_specs import named
from streamrt.backends.torch_inductor.target import device_kind, device_target
from streamrt.building.builder import BuildResult, make_manifest
from streamrt.building.verify import verify_module_build
from streamrt.config import BuildConfig, default_cache_dir
from streamrt.errors import ConfigError
from streamrt.onnx.profiles import resolve_profiles
from streamrt.plan import write_plan
from streamrt.types import DType, TensorSpec

__all__ = ["build_module", "module_sha256"]

log = logging.getLogger(__name__)


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
) -> BuildResult:
    """Build a torch_inductor plan straight from a PyTorch module, for users who start in PyTorch.

    Returns the same :class:`~streamrt.building.builder.BuildResult` as :func:`streamrt.build` (module builds
    are never cached: ``cached`` is False).

    Shapes come from ``config.profiles`` (by input name) or, when there are none, are static at
    the example inputs' shapes. The plan's output shapes come from the exported program: a
    dimension that follows a dynamic input (a batch) is recorded as ``-1``. fp16/bf16 cast the
    module's weights (inputs and outputs stay fp32 when ``keep_io_types``); int8 is only
    available through the ONNX path.

    Example:
        >>> build_module(net, [torch.randn(8, 3, 224, 224)], "net.plan",
        ...              BuildConfig(backend="torch_inductor", precision="fp16"))      # doctest: +SKIP
    """
    started = time.perf_counter()
    began = time.monotonic()  # the build budget's clock
    config = config or BuildConfig(backend="torch_inductor")
    if config.backend != "torch_inductor":
        config = config.replace(backend="torch_inductor")
    if config.precision.value == "int8":
        raise ConfigError("int8 from a PyTorch module is not supported; export to ONNX and build with --calib")
    report = progress or (lambda line: log.info("%s", line))
    kind = device_kind(config)
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
    dtypes = [t.dtype for t in example_inputs]
    backend = TorchInductorBackend()
    with inductor_cache(Path(cache_dir) if cache_dir is not None else default_cache_dir()), \
            out_of_memory_guard(f"building {type(module).__qualname__} with torch_inductor", BUILD_HINT):
        built = backend.build_from_module(net, names, dtypes, config, profiles, report, kind, began)
    # From the exported programs, not an eager run at the example: -1 where an output follows a dynamic input.
    outputs = named(built.outputs, output_names)
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
    manifest = verify_module_build(module, manifest, built.payload, config, report)  # BuildError: nothing written
    write_plan(out_path, manifest, built.payload)
    report(f"wrote {out_path} ({out_path.stat().st_size / 2**20:.2f} MiB)")
    return BuildResult(out_path, manifest, False, time.perf_counter() - started)
