"""An empty model repository starts the server with a warning that names the expected layout."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from streamrt.serve.configs.config import ServerConfig
from streamrt.serve.server import ServerThread

pytestmark = pytest.mark.timeout(60)


def _start(repo: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    config = ServerConfig(http_port=0, grpc_port=None, metrics_port=None)
    with caplog.at_level(logging.WARNING, logger="streamrt.serve"), ServerThread(repo, config):
        pass
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_empty_repository_warns_with_the_layout(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    warnings = _start(tmp_path, caplog)
    assert any(str(tmp_path) in w and f"{tmp_path}/NAME/1/model.onnx" in w for w in warnings), warnings


def test_repository_with_a_model_does_not_warn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "cnn").mkdir()  # a model folder without versions fails to load, but is a model
    warnings = _start(tmp_path, caplog)
    assert not any("has no models" in w for w in warnings), warnings
