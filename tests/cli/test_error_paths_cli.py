"""Every failing command: one line on stderr, exit 2, nothing left on disk (issue 20 and issue 16)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrt.cli.main import main


def _fails(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "no error line"
    return err[-1]


@pytest.mark.parametrize("command", ["inspect", "bench"])
def test_garbage_plan_is_not_called_an_onnx_model(tmp_path: Path, command: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.plan"
    path.write_bytes(b"garbage\n")
    line = _fails([command, str(path)], capsys)
    assert "not a StreamRT plan" in line and "b'garbage\\n'" in line
    assert "ONNX" not in line


def test_calibration_cache_reuse_is_said_once(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              caplog: pytest.LogCaptureFixture) -> None:
    import logging

    import numpy as np

    from helpers import catalogue_file

    src = catalogue_file("small_cnn", tmp_path)
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng()
    for i in range(2):
        np.save(calib / f"{i}.npy", rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    args = ["build", str(src), "-o", str(tmp_path / "q.plan"), "--precision", "int8", "--calib", str(calib),
            "--no-cache", "--cache-dir", str(tmp_path / "cache")]
    assert main(args) == 0
    capsys.readouterr()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert main(args) == 0
    # What a terminal shows: the progress lines on stderr plus every INFO log record.
    shown = capsys.readouterr().err.splitlines() + [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert sum("reusing calibration cache" in line for line in shown) == 1, shown
