"""Shared fixtures of the detection tests: the bundled detector on ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cv2")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plans")


@pytest.fixture(scope="session")
def detector(cache_dir: Path):  # type: ignore[no-untyped-def]
    from streamrt.video.model import bundled_model, open_detector

    return open_detector(bundled_model(), backend="onnxruntime", cache_dir=cache_dir, max_batch=4)


@pytest.fixture()
def rng() -> np.random.Generator:
    return np.random.default_rng()


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two tiny clips (20 frames each), encoded with PyAV: the CPU tests of decoder pools read them."""
    pytest.importorskip("av")
    from streamrt.video.clips import smoke_clips

    return smoke_clips(tmp_path_factory.mktemp("clips"))

