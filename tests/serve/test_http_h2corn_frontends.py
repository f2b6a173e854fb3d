"""``--http-server h2corn --frontend-processes 2``: test_frontend_processes.py's HTTP tests through worker processes
that serve HTTP on h2corn (inference over the engine link, request bodies read into the arena, every other route
forwarded to the engine process's aiohttp app)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("h2corn")
pytest.importorskip("tritonclient.http")

from tests.serve.test_frontend_processes import (  # noqa: F401  (re-run here, against h2corn)
    test_control_endpoints_through_workers,
    test_http_and_grpc_inference_through_workers,
    test_large_outputs_through_the_arena_and_its_fallback,
    two_workers,
)

from streamrt.serve.server import ServerThread

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, plans: dict[str, Path]) -> Iterator[ServerThread]:
    yield from two_workers(tmp_path_factory, plans, http_server="h2corn")
