"""The layer contract of ``pyproject.toml`` (``[tool.importlinter]``) holds for ``src/streamrt``.

import-linter checks six contracts (docs/architecture.md): the layers run one way, the backend
packages are independent, engine modules import no build code, serve/'s rooms run one way
(listeners over the core over the models over scheduling over execution), no listener imports a
model, a scheduler or the execution room directly, and no two sibling modules or packages import
each other in a circle. Each check runs ``lint-imports`` in a subprocess whose
``sys.path`` starts with the tree under test, so an installed copy of StreamRT cannot answer for it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the dev extra")

ROOT = Path(__file__).resolve().parents[1]
_RUN = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))"
)


def _lint(src: Path, config: Path = ROOT / "pyproject.toml") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [sys.executable, "-c", _RUN, str(config)],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_contracts_hold() -> None:
    run = _lint(ROOT / "src")
    assert run.returncode == 0, f"import contracts broken:\n{run.stdout}\n{run.stderr}"
    assert "BROKEN" not in run.stdout


def test_an_upward_import_and_a_circle_break_the_contracts(tmp_path: Path) -> None:
    # The contracts must bite: a copy of the package where errors.py (the bottom layer) imports
    # the CLI (the top) and building/builder.py is imported back by plan.py must fail both checks.
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "streamrt", src / "streamrt", ignore=shutil.ignore_patterns("__pycache__"))
    with (src / "streamrt" / "errors.py").open("a") as f:
        f.write("\nimport streamrt.cli.main  # noqa: E402\n")
    with (src / "streamrt" / "plan.py").open("a") as f:
        f.write("\nimport streamrt.building.builder  # noqa: E402\n")
    run = _lint(src)
    assert run.returncode != 0
    assert "streamrt.errors -> streamrt.cli.main" in run.stdout
    assert "No cycles are allowed in streamrt" in run.stdout


def test_the_run_side_importing_the_build_side_breaks_the_contracts(tmp_path: Path) -> None:
    # Loading must not import the build side: running/ importing building/ breaks the layers and
    # the engines-without-builders contract, and measure/ (below the configs) importing the
    # profiling room breaks the layers too: the noise rule has one home, below both.
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "streamrt", src / "streamrt", ignore=shutil.ignore_patterns("__pycache__"))
    with (src / "streamrt" / "running" / "runtime.py").open("a") as f:
        f.write("\nimport streamrt.building.builder  # noqa: E402\n")
    with (src / "streamrt" / "measure" / "noise.py").open("a") as f:
        f.write("\nimport streamrt.profiling.bench  # noqa: E402\n")
    run = _lint(src)
    assert run.returncode != 0
    assert "streamrt.running is not allowed to import streamrt.building" in run.stdout
    assert "streamrt.running.runtime -> streamrt.building.builder" in run.stdout
    assert "are separate) BROKEN" in run.stdout  # engines-without-builders (its name wraps in the report)
    assert "streamrt.measure is not allowed to import streamrt.profiling" in run.stdout


def test_a_listener_and_execution_reaching_each_other_break_the_serve_contracts(tmp_path: Path) -> None:
    # serve/'s rooms (pyproject.toml, serve-rooms and listeners-without-execution): an instance
    # importing the HTTP listener is an upward import, and the gRPC listener importing the
    # instances directly reaches past the core; each must break its contract.
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "streamrt", src / "streamrt", ignore=shutil.ignore_patterns("__pycache__"))
    serve = src / "streamrt" / "serve"
    with (serve / "execution" / "instances.py").open("a") as f:
        f.write("\nimport streamrt.serve.listeners.http  # noqa: E402\n")
    with (serve / "listeners" / "grpc_service.py").open("a") as f:
        f.write("\nimport streamrt.serve.execution.placement  # noqa: E402\n")
    run = _lint(src)
    assert run.returncode != 0
    assert "streamrt.serve.execution is not allowed to import streamrt.serve.listeners" in run.stdout
    assert "streamrt.serve.execution.instances -> streamrt.serve.listeners.http" in run.stdout
    assert "streamrt.serve.listeners.grpc_service -> streamrt.serve.execution.placement" in run.stdout
    assert "streamrt.serve.listeners is not allowed to import streamrt.serve.execution" in run.stdout
    assert "core and the port) BROKEN" in run.stdout  # listeners-without-execution (its name wraps)


def _migrate_script() -> ModuleType:
    path = ROOT / "scripts" / "migrate_engine_imports.py"
    spec = importlib.util.spec_from_file_location("migrate_engine_imports", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_migration_script_knows_every_module_in_serve_rooms() -> None:
    # Branches that predate the rooms are migrated with scripts/migrate_engine_imports.py: each
    # module or package inside a room must be in its table, at the path it really has.
    script = _migrate_script()
    serve = ROOT / "src" / "streamrt" / "serve"
    found = {
        child.stem: f"{room.name}.{child.stem}"
        for room in serve.iterdir()
        if room.is_dir() and (room / "__init__.py").exists()
        for child in room.iterdir()
        if child.name != "__init__.py" and (child.suffix == ".py" or (child / "__init__.py").exists())
    }
    assert found == script.SERVE_MOVES


def test_the_migration_script_rewrites_old_serve_paths_once() -> None:
    script = _migrate_script()
    old = (
        "from streamrt.serve.config import ModelConfig\n"
        "from streamrt.serve import model as model_module\n"
        "from streamrt.serve import ServerConfig\n"
        'monkeypatch.setattr("streamrt.serve.frontends.worker.main", f)\n'
        "see src/streamrt/serve/instances.py and tests/serve/test_instances.py\n"
    )
    new = script.rewrite(old)
    assert new == (
        "from streamrt.serve.configs.config import ModelConfig\n"
        "from streamrt.serve.models import model as model_module\n"
        "from streamrt.serve import ServerConfig\n"
        'monkeypatch.setattr("streamrt.serve.listeners.frontends.worker.main", f)\n'
        "see src/streamrt/serve/execution/instances.py and tests/serve/test_instances.py\n"
    )
    assert script.rewrite(new) == new
