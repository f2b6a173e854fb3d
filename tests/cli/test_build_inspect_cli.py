"""`streamrt build` / `inspect` / `--help`: output, and one line + exit 2 for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import catalogue_file, checker_failing_model, save, unsupported_op_model
from streamrt.cli.main import SUBCOMMANDS, main


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        if importlib.util.find_spec(f"streamrt.cli.{name}") is not None:
            assert name.replace("_", "-") in out


def test_version_from_console_script() -> None:
    out = subprocess.run([sys.executable, "-m", "streamrt.cli.main", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("streamrt 0.")


def test_python_dash_m_streamrt_is_the_cli() -> None:
    """``python -m streamrt``: the command from a checkout on PYTHONPATH (the device machine's scripts)."""
    out = subprocess.run([sys.executable, "-m", "streamrt", "profile", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("usage: streamrt profile")


def test_build_then_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    plan = tmp_path / "cnn.plan"
    args = [
        "build",
        str(src),
        "-o",
        str(plan),
        "--cache-dir",
        str(tmp_path / "c"),
        "--min-shapes",
        "x:1x3x32x32",
        "--opt-shapes",
        "x:4x3x32x32",
        "--max-shapes",
        "x:8x3x32x32",
    ]
    assert main(args) == 0
    assert "built in" in capsys.readouterr().out
    assert main(args) == 0
    assert "reused from cache" in capsys.readouterr().out
    assert main(["inspect", str(plan), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "plan" and info["profiles"][0]["x"]["max"] == [8, 3, 32, 32]
    assert info["op_histogram"]
    assert main(["inspect", str(src)]) == 0
    text = capsys.readouterr().out
    assert "Conv" in text and "?x3x32x32" in text


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    good = catalogue_file("matmul", tmp)
    not_onnx = tmp / "not.onnx"
    not_onnx.write_bytes(b"definitely not protobuf")
    broken_plan = tmp / "broken.plan"
    assert main(["build", str(good), "-o", str(broken_plan), "--no-cache"]) == 0
    broken_plan.write_bytes(broken_plan.read_bytes()[:-10])
    empty_calib = tmp / "empty_calib"
    empty_calib.mkdir()
    bad_calib = tmp / "bad_calib"
    bad_calib.mkdir()
    np.save(bad_calib / "a.npy", np.random.default_rng().standard_normal((1, 16)).astype(np.float32))
    return {
        "empty calib": (
            ["build", str(good), "-o", str(tmp / "o.plan"), "--precision", "int8", "--calib", str(empty_calib)],
            "holds no samples",
        ),
        "calib shape": (
            ["build", str(good), "-o", str(tmp / "o.plan"), "--precision", "int8", "--calib", str(bad_calib)],
            "input 'x' expects shape ?x32, got 1x16",
        ),
        "missing": (["build", str(tmp / "none.onnx"), "-o", str(tmp / "o.plan")], "file not found"),
        "not onnx": (["build", str(not_onnx), "-o", str(tmp / "o.plan")], "not an ONNX model"),
        "checker": (
            ["build", str(save(checker_failing_model(), tmp / "c.onnx")), "-o", str(tmp / "o.plan")],
            "fails the ONNX checker",
        ),
        "operator": (
            ["build", str(save(unsupported_op_model(), tmp / "u.onnx")), "-o", str(tmp / "o.plan")],
            "uses operator Sqrt",
        ),
        "profile": (
            [
                "build",
                str(good),
                "-o",
                str(tmp / "o.plan"),
                "--min-shapes",
                "y:1x32",
                "--max-shapes",
                "y:4x32",
            ],
            "names input 'y'",
        ),
        "calib": (
            ["build", str(good), "-o", str(tmp / "o.plan"), "--precision", "int8"],
            "needs calibration",
        ),
        "plan": (["inspect", str(broken_plan)], "checksum"),
        "inspect missing": (["inspect", str(tmp / "none.plan")], "file not found"),
    }


def test_bad_inputs_give_one_line_and_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = _bad_inputs(tmp_path)
    capsys.readouterr()
    for label, (argv, message) in cases.items():
        assert main(argv) == 2, label
        lines = capsys.readouterr().err.strip().splitlines()
        errors = [line for line in lines if "error:" in line]
        assert len(errors) == 1 and lines[-1] == errors[0], (label, lines)
        assert message in errors[0] and errors[0].startswith(f"streamrt {argv[0]}: error:"), (label, lines)
    assert not (tmp_path / "o.plan").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
