"""One CLI grammar (docs/cli.md): shared flags, old spellings kept, and no tracebacks."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import catalogue_file
from streamrt.backends import BACKENDS
from streamrt.cli.main import _parser, main

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _run(*argv: str, stdin_pipe: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "streamrt.cli.main", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def test_shared_flags_mean_the_same_everywhere() -> None:
    subs = _subparsers()
    for name in ("build", "pipeline-bench", "demo", "detect", "perf"):
        opts = _options(subs[name])
        assert "-o" in opts and "--output" in opts, name
        assert opts["-o"].dest == "output", name
    assert _options(subs["bench"])["--warmup-ms"].dest == "warmup_ms"
    assert _options(subs["perf"])["--warmup-ms"].dest == "warmup_ms"
    assert _options(subs["pipeline-bench"])["--warmup-items"].dest == "warmup_items"
    for name in ("build", "bench", "compare", "profile", "demo", "detect"):
        assert list(_options(subs[name])["--backend"].choices or ()) == list(BACKENDS), name
    assert _options(subs["pipeline-bench"])["--device"].choices == ("auto", "cuda", "cpu")


def test_old_spellings_still_work_and_are_hidden() -> None:
    subs = _subparsers()
    for name, old, new_dest in (("pipeline-bench", "--out", "output"), ("demo", "--out-dir", "output"),
                                ("detect", "--out", "output"), ("perf", "--csv", "output"),
                                ("bench", "--warmup", "warmup_ms"), ("perf", "--warmup", "warmup_ms"),
                                ("pipeline-bench", "--warmup", "warmup_items"), ("detect", "--json", "jsonl"),
                                ("demo", "--size", "frame_size")):
        action = _options(subs[name])[old]
        assert action.dest == new_dest and action.help == argparse.SUPPRESS, (name, old)
        assert old not in subs[name].format_help().replace(f"{old}-", "").split(), (name, old)
    args = _parser().parse_args(["demo", "--out-dir", "x"])
    assert args.output == Path("x")
    args = _parser().parse_args(["pipeline-bench", "--warmup", "3"])
    assert args.warmup_items == 3


def test_deprecated_warmup_prints_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["bench", "m.plan", "--warmup", "50"])
    assert args.warmup_ms == 50.0
    assert "--warmup is deprecated; use --warmup-ms" in capsys.readouterr().err


def test_global_flags_after_the_subcommand() -> None:
    assert _parser().parse_args(["inspect", "x.onnx", "-v"]).verbose is True
    assert _parser().parse_args(["-v", "inspect", "x.onnx"]).verbose is True
    assert _parser().parse_args(["inspect", "x.onnx"]).verbose is False


def test_help_texts_have_no_rst_markup() -> None:
    for name, sub in _subparsers().items():
        assert "``" not in sub.format_help(), name
        assert ":class:" not in sub.format_help(), name


def test_build_into_a_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    assert main(["build", str(src), "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is a directory" in err and "hint: -o" in err and "small_cnn.plan" in err


def test_unwritable_output_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # a path below a regular file cannot be created, even by root
    assert main(["build", str(src), "-o", str(blocker / "cnn.plan"), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{blocker} is a file" in err and "Traceback" not in err
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert main(["build", str(src), "-o", str(locked / "cnn.plan")]) == 2
        assert "permission denied" in capsys.readouterr().err


def test_inspect_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    env = {**os.environ, "PYTHONPATH": SRC}
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head` that has already exited: every write fails with EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "streamrt.cli.main", "inspect", str(src)], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    finally:
        os.close(write_end)
    assert proc.stderr == "" and proc.returncode == 141, proc.stderr


def test_serve_on_a_busy_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _run("serve", str(tmp_path), "--http-port", str(port), "--grpc-port", "-1", "--metrics-port", "-1",
                    timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port}" in lines[0] and "--http-port N" in lines[0], proc.stderr
