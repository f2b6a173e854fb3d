"""Rewrite imports of old module paths to their new packages (issue 25): engine side and serve/.

For branches that predate the regrouping: ``streamrt.builder`` -> ``streamrt.building.builder``,
``streamrt.runtime`` -> ``streamrt.running.runtime``, ``streamrt.accuracy`` ->
``streamrt.measure.accuracy``, the profiling room's stats and rounds -> ``streamrt.measure``, and
the rest of :data:`MOVES`. The plan metadata key ``"streamrt.inputs"`` (data, not a module) is
left alone.

The server's flat modules moved into concern folders (:data:`SERVE_MOVES`):
``streamrt.serve.model`` -> ``streamrt.serve.models.model``, ``streamrt.serve.config`` ->
``streamrt.serve.configs.config``, ``streamrt.serve.frontends`` ->
``streamrt.serve.listeners.frontends`` and so on, in dotted paths (imports, ``monkeypatch`` strings,
docs), in ``from streamrt.serve import model as m`` and in file paths (``serve/model.py`` ->
``serve/models/model.py``). Running it twice changes nothing the second time. Prints each file it
changed.

Usage (from the repository root, after a merge)::

    python scripts/migrate_engine_imports.py $(git ls-files 'src/*.py' 'tests/*.py' 'benchmarks/*.py' \\
        'scripts/*.py' 'examples/*.py' '*.md')
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

MOVES = {
    "builder": "building.builder",
    "module_builder": "building.module_builder",
    "opening": "building.opening",
    "accuracy_gate": "building.accuracy_gate",
    "speed_check": "building.speed_check",
    "runtime": "running.runtime",
    "inputs": "running.inputs",
    "compare": "running.compare",
    "accuracy": "measure.accuracy",
    "profiling.rounds": "measure.rounds",
    "profiling.stats": "measure.stats",
}
# Module (or package) at the top of serve/ -> its concern folder (docs/architecture.md, "serve/").
SERVE_ROOMS = {
    "wire": ["protocol", "status", "shared_memory", "grpc_wire", "proto", "http_headers", "grpc_layouts",
             "bytes_tensor"],  # the last 3: new in the room, no old path
    "configs": ["config", "config_message", "triton_config", "ensemble_config", "model_files", "derived_profiles"],
    "observability": ["stats", "tracing", "otel"],
    "execution": ["instances", "placement", "memory_budget", "integrity", "rate_limiter"],
    "scheduling": ["batcher", "loop", "scheduler", "sequence", "timers"],  # loop: new in the room, no old path
    "models": ["model", "servable", "ensemble", "repository", "classification", "python_backend",
               "scheduled", "engine_files", "engine_config"],  # the last three: new in the room, no old path
    "listeners": ["http", "http_forward", "http_h2corn", "h2corn_server", "grpc_service", "grpc_h2corn", "metrics",
                  "frontends"],  # http_forward, http_h2corn, h2corn_server: new in the room, no old path
}
SERVE_MOVES = {module: f"{room}.{module}" for room, modules in SERVE_ROOMS.items() for module in modules}
_SERVE_NAMES = "|".join(re.escape(m) for m in SERVE_MOVES)
_SERVE_MODULE = re.compile(r"(?<![\w.])streamrt\.serve\.(" + _SERVE_NAMES + r")(?!\w)")
# ``from streamrt.serve import model as model_module`` (one module, imported by name).
_SERVE_FROM = re.compile(r"\bfrom streamrt\.serve import (" + _SERVE_NAMES + r")\b(?=\s+as\s|\s*$)", re.MULTILINE)
# ``src/streamrt/serve/model.py``, ``serve/frontends/worker.py`` (never ``tests/serve/...``).
_SERVE_PATH = re.compile(r"(?<![\w.])(?<!tests/)((?:src/)?(?:streamrt/)?serve/)(" + _SERVE_NAMES + r")(?=\.py\b|/)")

_MODULE = re.compile(r"(?<![\w.])streamrt\.(" + "|".join(re.escape(m) for m in MOVES) + r")(?!\w)")


def rewrite(text: str) -> str:
    """``text`` with every old module path replaced (the quoted ``"streamrt.inputs"`` key kept)."""

    def new_path(match: re.Match[str]) -> str:
        quoted = text[match.start() - 1: match.start()] == '"' and text[match.end(): match.end() + 1] == '"'
        if match.group(1) == "inputs" and quoted:
            return match.group(0)
        return "streamrt." + MOVES[match.group(1)]

    text = _MODULE.sub(new_path, text)
    return rewrite_serve(text)


def _room(module: str) -> str:
    return SERVE_MOVES[module].split(".")[0]


def rewrite_serve(text: str) -> str:
    """``text`` with the server's flat module paths replaced by their concern folders."""
    text = _SERVE_MODULE.sub(lambda m: "streamrt.serve." + SERVE_MOVES[m.group(1)], text)
    text = _SERVE_FROM.sub(lambda m: f"from streamrt.serve.{_room(m.group(1))} import {m.group(1)}", text)
    return _SERVE_PATH.sub(lambda m: m.group(1) + SERVE_MOVES[m.group(2)].replace(".", "/"), text)


def main(paths: list[str]) -> int:
    for name in paths:
        path = Path(name)
        if path.resolve() == Path(__file__).resolve():
            continue  # its own table names the old paths
        text = path.read_text()
        new = rewrite(text)
        if new != text:
            path.write_text(new)
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
