"""``--http-server h2corn --frontend-processes 2``: test_frontend_processes.py's HTTP tests through worker processes
that serve HTTP on h2corn (inference over the engine link, request bodies read into the arena, every other route
forwarded to the engine process's aiohttp app)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
import yaml

pytest.importorskip("h2corn")
pytest.importorskip("tritonclient.http")

from tests.serve.conftest import server_config
from tests.serve.test_frontend_processes import (  # noqa: F401  (re-run here, against h2corn)
    double_model,
    frontends_server,
    test_control_endpoints_through_workers,
    test_http_and_grpc_inference_through_workers,
    test_large_outputs_through_the_arena_and_its_fallback,
)

from streamrt.serve.server import ServerThread
from streamrt.testing.sequence_models import accumulator, accumulator_config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, plans: dict[str, Path]) -> Iterator[ServerThread]:
    """test_frontend_processes.py's server (two workers, 1 MiB arenas), HTTP on h2corn."""
    root = tmp_path_factory.mktemp("repo")
    (root / "double" / "1").mkdir(parents=True)
    onnx.save(double_model(), str(root / "double" / "1" / "model.onnx"))
    (root / "double" / "config.yaml").write_text("max_batch_size: 8\n")
    (root / "acc" / "1").mkdir(parents=True)
    onnx.save(accumulator(4), str(root / "acc" / "1" / "model.onnx"))
    (root / "acc" / "config.yaml").write_text(yaml.safe_dump(accumulator_config(4)))
    startup = (*server_config().startup_models, "double", "acc")
    with frontends_server(root, plans, frontend_arena_bytes=2**20, startup_models=startup,
                          http_server="h2corn") as running:
        assert running.frontends is not None and len(running.frontends.workers) == 2
        yield running
