"""Optimization levels 0..5 (TensorRT's meaning) resolved into AOTInductor knobs: the build recipe.

The table, the build-time figures behind it and the knobs' meanings are in
``docs/optimization-levels.md``. In short: 0-2 cut compile time (0 the most), 3 is the
default recipe (Inductor's defaults), 4 adds max-autotune for GEMMs and convolutions over the
GEMM backends that build here, 5 adds coordinate-descent tuning, freezing (constant folding),
a memory-format choice and cuDNN benchmark mode.

Level 5 on CUDA is the **bounded** recipe (:data:`LEVEL5_CUDA`): GEMMs autotuned (1x1
convolutions in channels-last become GEMMs), every other convolution left to cuDNN timing its own
algorithms (benchmark mode), Inductor's layout heuristic instead of compiling both layouts, and
convolution + (residual add +) ReLU run as cuDNN's fused kernels (``conv_epilogues=cudnn``: on the
H200, 2026-12-04, ResNet-50 fp16 batch 32 at level 5 ran 27,987 images/s with them and 21,074
with Inductor's own epilogue kernels, same run; built in 158 s, autotuned, no fallback).
Why: on the H200 (2026-12-01) one level-5 ResNet-50 compile that also autotuned Triton convolution
templates ran past its 211 s deadline (choices failing "out of resource: shared memory"), and
measuring two layouts doubles that; Inductor's own config says Triton convolution templates show
no gains on CUDA (H100). ``--option conv_backends=ATEN,TRITON --option memory_format=measure`` is
the earlier, unbounded level 5.

Explicit backend options (``max_autotune``, ``coordinate_descent_tuning``, ``freezing``,
``memory_format``, ``conv_backends``, ``cudnn_benchmark``) override what the level says; the resolved recipe is what
the plan's manifest records and what the build cache key includes.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streamrt.config import BuildConfig
from streamrt.errors import ConfigError

__all__ = ["BOUNDED_AUTOTUNE", "CONV_BACKENDS", "CONV_EPILOGUES", "EPILOGUE_KNOB",
           "LEVEL5_CUDA", "MEMORY_FORMATS", "Recipe", "gemm_backends",
           "inductor_knows", "layout_knobs", "resolve_recipe"]

#: ``inductor``: Inductor's own layout heuristic (channels-last for convolution graphs it judges
#: worth it); ``measure``: compile both layouts and keep the faster at the opt shape;
#: ``channels_last`` / ``contiguous``: forced.
MEMORY_FORMATS = ("inductor", "measure", "channels_last", "contiguous")

#: ``max_autotune_conv_backends`` a build may ask for (``--option conv_backends=...``): ``ATEN``
#: (ATen's convolution: cuDNN on CUDA) alone, or with Inductor's Triton convolution templates.
CONV_BACKENDS = ("ATEN", "ATEN,TRITON")

#: ``conv_epilogues`` a build may ask for (:mod:`.conv_epilogues`): Inductor's own pointwise kernels,
#: or cuDNN's fused convolution + (add +) ReLU for every eligible convolution or only those larger than 1x1.
CONV_EPILOGUES = ("inductor", "cudnn", "cudnn_spatial")

#: The key that carries a build's ``conv_epilogues`` in its Inductor configs to
#: :func:`.builder.compile_package`, which pops it before Inductor sees them (it keeps cache keys apart).
EPILOGUE_KNOB = "streamrt.conv_epilogues"

#: What level 5 on CUDA sets apart from level 4 + coordinate descent + freezing (see the module
#: docstring): convolutions from cuDNN (its benchmark mode times its algorithms), Inductor's layout
#: heuristic (channels-last for convolution graphs it judges worth it) instead of two compiles, and
#: cuDNN's fused convolution epilogues.
LEVEL5_CUDA: dict[str, str] = {"conv_backends": "ATEN", "memory_format": "inductor", "conv_epilogues": "cudnn"}

# Level 0's compile-time cuts (measured in docs/optimization-levels.md): the AOTInductor wrapper
# compiled at -O0, Inductor's pattern-matcher passes off; on CUDA, one heuristic config per
# pointwise Triton kernel instead of benchmarking several.
_FAST_BUILD: dict[str, dict[str, Any]] = {
    "cpu": {"aot_inductor.compile_wrapper_opt_level": "O0", "pattern_matcher": False},
    "cuda": {
        "aot_inductor.compile_wrapper_opt_level": "O0",
        "pattern_matcher": False,
        "triton.autotune_pointwise": False,
    },
}

# Levels 4-5 on CUDA: autotuning that stays bounded (docs/optimization-levels.md, "Bounded autotuning").
# Prune Triton GEMM/convolution configs whose shared memory cannot fit the GPU before they are compiled
# (the H200 run failed choices with "out of resource: shared memory, Required: 262144, Hardware limit:
# 232448"; Inductor's estimate is an upper bound and drops a few valid configs too: it has been off by
# default since pytorch#170832), and keep the GEMM search space at DEFAULT even where a user's
# TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_SEARCH_SPACE says EXHAUSTIVE. Knobs this torch lacks are left out.
BOUNDED_AUTOTUNE: dict[str, Any] = {
    "max_autotune_prune_choices_based_on_shared_mem": True,
    "max_autotune_gemm_search_space": "DEFAULT",
}


def inductor_knows(name: str) -> bool:
    """Whether this torch's ``torch._inductor.config`` has the (dotted) knob ``name``."""
    try:
        import torch._inductor.config as node
    except ImportError:
        return False
    obj: Any = node
    for part in name.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


@dataclass(frozen=True)
class Recipe:
    """What one optimization level means for one build, after backend options.

    Attributes:
        level: the optimization level (0..5).
        inductor: the Inductor configs handed to ``aoti_compile_and_package`` (no metadata).
        memory_format: one of :data:`MEMORY_FORMATS`; ``measure`` is decided during the build.
        cudnn_benchmark: engines run with ``torch.backends.cudnn.benchmark`` on (CUDA only):
            cuDNN times its algorithms for each new input shape on the first call.
        conv_epilogues: one of :data:`CONV_EPILOGUES` (:mod:`.conv_epilogues`).
    """

    level: int
    inductor: Mapping[str, Any] = field(default_factory=dict)
    memory_format: str = "inductor"
    cudnn_benchmark: bool = False
    conv_epilogues: str = "inductor"

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "inductor": dict(sorted(self.inductor.items())),
            "memory_format": self.memory_format,
            "cudnn_benchmark": self.cudnn_benchmark,
            "conv_epilogues": self.conv_epilogues,
        }


def gemm_backends(kind: str) -> str:
    """The ``max_autotune_gemm_backends`` that build here: ATen and Triton on CUDA (CUTLASS when
    its Python package and ``nvcc`` are both present), ATen and Inductor's C++ templates on CPU."""
    if kind != "cuda":
        return "ATEN,CPP"
    cutlass = importlib.util.find_spec("cutlass_library") is not None and shutil.which("nvcc") is not None
    return "ATEN,TRITON,CUTLASS" if cutlass else "ATEN,TRITON"


def layout_knobs(memory_format: str) -> dict[str, Any]:
    """Inductor's layout switches for a decided memory format (none for Inductor's heuristic)."""
    if memory_format == "channels_last":
        return {"layout_optimization": True, "force_layout_optimization": True}
    if memory_format == "contiguous":
        return {"layout_optimization": False}
    return {}


def _conv_backends(opts: Mapping[str, Any], default: str) -> str:
    value = str(opts.get("conv_backends", default)).upper().replace(" ", "")
    if value not in CONV_BACKENDS:
        raise ConfigError(f"torch_inductor option conv_backends must be one of {', '.join(CONV_BACKENDS)}, "
                          f"got {opts.get('conv_backends')!r}")
    return value


def _conv_epilogues(opts: Mapping[str, Any], kind: str, default: str) -> str:
    value = str(opts.get("conv_epilogues", default)).lower()
    if value not in CONV_EPILOGUES:
        raise ConfigError(f"torch_inductor option conv_epilogues must be one of {', '.join(CONV_EPILOGUES)}, "
                          f"got {opts.get('conv_epilogues')!r}")
    if value != "inductor" and kind != "cuda":
        raise ConfigError(f"torch_inductor option conv_epilogues={value} needs a CUDA build (the fused kernels "
                          "are cuDNN's); leave it out on the CPU")
    return value


def resolve_recipe(config: BuildConfig, kind: str) -> Recipe:
    """The recipe of ``config.optimization_level`` on ``kind`` (``cuda`` or ``cpu``), options applied."""
    level, opts = config.optimization_level, config.backend_options
    inductor: dict[str, Any] = dict(_FAST_BUILD[kind]) if level == 0 else {}
    if level in (1, 2):
        inductor["aot_inductor.compile_wrapper_opt_level"] = "O0"
    if level == 1 and kind == "cuda":
        inductor["triton.autotune_pointwise"] = False
    inductor.update(max_autotune=level >= 4, coordinate_descent_tuning=level >= 5, freezing=level >= 5)
    bounded5 = level >= 5 and kind == "cuda"
    if level >= 4:
        inductor["max_autotune_gemm_backends"] = gemm_backends(kind)
        inductor["max_autotune_conv_backends"] = _conv_backends(opts, LEVEL5_CUDA["conv_backends"] if bounded5
                                                                else "ATEN,TRITON" if kind == "cuda" else "ATEN")
        if kind == "cuda":
            inductor.update({k: v for k, v in BOUNDED_AUTOTUNE.items() if inductor_knows(k)})
    for key in ("max_autotune", "coordinate_descent_tuning", "freezing"):
        if key in opts:
            inductor[key] = bool(opts[key])
    if kind == "cpu":
        # C++ kernels read the team size at run time (the engine's thread policy), instead of
        # baking in the build machine's thread count.
        inductor["cpp.dynamic_threads"] = True
    default_format = LEVEL5_CUDA["memory_format"] if bounded5 else "measure" if level >= 5 else "inductor"
    memory_format = str(opts.get("memory_format", default_format))
    if memory_format not in MEMORY_FORMATS:
        raise ConfigError(
            f"torch_inductor option memory_format must be one of {', '.join(MEMORY_FORMATS)}, got {memory_format!r}"
        )
    inductor.update(layout_knobs(memory_format))
    epilogues = _conv_epilogues(opts, kind, LEVEL5_CUDA["conv_epilogues"] if bounded5 else "inductor")
    return Recipe(level, inductor, memory_format, cudnn_benchmark=_cudnn_benchmark(opts, kind, level),
                  conv_epilogues=epilogues)


def _cudnn_benchmark(opts: Mapping[str, Any], kind: str, level: int) -> bool:
    """cuDNN benchmark mode: on at level 5 on CUDA (``--option cudnn_benchmark=true|false`` decides otherwise;
    CUDA only). With cuDNN's fused epilogues it measured 27,790 images/s on and 26,980 off (ResNet-50 fp16,
    H200, 2026-12-04, same run, within the spread); a fresh process's first call was as slow either way."""
    if "cudnn_benchmark" not in opts:
        return level >= 5 and kind == "cuda"
    value = opts["cudnn_benchmark"]
    on = value if isinstance(value, bool) else str(value).strip().lower()
    if on not in (True, False, "true", "false", "1", "0", "on", "off"):
        raise ConfigError(f"torch_inductor option cudnn_benchmark must be true or false, got {value!r}")
    on = on in (True, "true", "1", "on")
    if on and kind != "cuda":
        raise ConfigError("torch_inductor option cudnn_benchmark=true needs a CUDA build (it times cuDNN's "
                          "convolution algorithms); leave it out on the CPU")
    return bool(on)
