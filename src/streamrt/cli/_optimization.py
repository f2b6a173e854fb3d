"""One-line summaries of a plan's optimization choices, shared by ``build`` and ``inspect``.

They read the manifest's ``build_settings``: the level from the config, the resolved choices
the backend recorded (torch_inductor's ``optimization`` and ``timing_cache``; TensorRT's
``builder_optimization_level``, ``tf32`` and ``timing_cache``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["budget_line", "optimization_lines"]


def _on(value: Any) -> str:
    return "on" if value else "off"


def budget_line(record: Mapping[str, Any] | None) -> str:
    """``build budget ...``: whether the autotuning kept to ``--build-budget-s`` or fell back, and to what.

    Reads ``build_settings.backend.build_budget`` (:meth:`BuildBudget.to_dict`); empty when the build
    recorded none or ran no autotuning compile under it (nothing to say). A plan that fell back runs
    kernels of the level-3 recipe (or of the autotuned recipe without coordinate descent) where the line
    says so, although its level and knobs read 5.
    """
    if not record or not (record.get("child_compiles") or record.get("fell_back")):
        return ""
    seconds = record.get("seconds")
    head = f"  build budget {seconds:g} s" if isinstance(seconds, (int, float)) else "  build budget none"
    events = record.get("fell_back") or []
    if not events:
        return (f"{head}: kept (autotuned in {record.get('child_compiles')} compile process(es), "
                f"{record.get('spent_s')} s spent)")
    what = "; ".join(f"{e.get('what')} -> {e.get('to')} after {e.get('after_s')} s"
                     + (f" ({e['why']})" if e.get("why") else "") for e in events)
    return f"{head}: FELL BACK, {what}"


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
        autotune = "off"
        if knobs.get("max_autotune"):
            convs = knobs.get("max_autotune_conv_backends")
            autotune = f"on ({knobs.get('max_autotune_gemm_backends')}{f'; convolutions {convs}' if convs else ''})"
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
    budget = budget_line(backend.get("build_budget"))
    if budget:
        lines.append(budget)
    cache = backend.get("timing_cache") if timing_cache else None
    if isinstance(cache, Mapping):
        state = f"ignored ({cache['ignored']})" if cache.get("ignored") else f"{cache.get('hits', 0)} hits"
        package = f"; package {cache['package']}" if cache.get("package") else ""
        lines.append(f"  timing cache {cache.get('path')}: {state}, {cache.get('misses', 0)} misses{package}")
    elif cache:
        lines.append(f"  timing cache {cache}")
    return lines
