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
