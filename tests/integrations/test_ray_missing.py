"""Without Ray installed the integration refuses with the extra to install, not an ImportError."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from streamrt.errors import MissingDependencyError
from streamrt.integrations.ray_serve import streamrt_app


def test_without_ray_the_error_names_the_ray_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    with pytest.raises(MissingDependencyError, match=r"ray"):
        streamrt_app(tmp_path)
