"""One-line summaries of a plan's optimization choices, shared by ``build`` and ``inspect``.

They read the manifest's ``build_settings``: the level from the config, the resolved choices
the backend recorded (torch_inductor's ``optimization`` and ``timing_cache``; TensorRT's
``builder_optimization_level``, ``tf32`` and ``timing_cache``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["optimization_lines"]


def _on(value: Any) -> str:
    return "on" if value else "off"


def optimization_lines(build_settings: Mapping[str, Any], *, timing_cache: bool = True) -> list[str]:
    """``optimization ...`` and (``timing_cache``) ``timing cache ...`` lines; empty for backends that record neither.

    A plan reused from the build cache prints no timing-cache line: its hits and misses are those
    of the build that made it.
    """
    config = build_settings.get("config", {})
    backend = build_settings.get("backend", {})
    lines = []
    recipe = backend.get("optimization")
    if recipe:
        knobs = recipe.get("inductor", {})
        autotune = f"on ({knobs.get('max_autotune_gemm_backends')})" if knobs.get("max_autotune") else "off"
        layout = recipe.get("memory_format_decision") or {}
        memory = recipe.get("memory_format", "inductor")
        if layout:
            times = ", ".join(f"{k} {v:.3f} ms" for k, v in layout.get("timings_ms", {}).items())
            why = f"measured: {times}" if times else layout.get("reason", "")
            memory = f"{layout.get('memory_format')} ({why})"
        lines.append(
            f"  optimization level {recipe.get('level')}: max_autotune {autotune}, coordinate descent "
            f"{_on(knobs.get('coordinate_descent_tuning'))}, freezing {_on(knobs.get('freezing'))}, "
            f"memory format {memory}, cudnn benchmark {_on(recipe.get('cudnn_benchmark'))}, "
            f"tf32 {_on(config.get('tf32'))}"
        )
    elif "builder_optimization_level" in backend:
        lines.append(f"  optimization builder_optimization_level {backend['builder_optimization_level']}, "
                     f"tf32 {_on(backend.get('tf32'))}")
    cache = backend.get("timing_cache") if timing_cache else None
    if isinstance(cache, Mapping):
        state = f"ignored ({cache['ignored']})" if cache.get("ignored") else f"{cache.get('hits', 0)} hits"
        lines.append(f"  timing cache {cache.get('path')}: {state}, {cache.get('misses', 0)} misses")
    elif cache:
        lines.append(f"  timing cache {cache}")
    return lines
