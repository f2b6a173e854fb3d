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
                                ("demo", "--size", "frame_size"), ("pipeline-bench", "--frames", "distinct_frames"),
                                ("pipeline-bench", "--height", "old_height"),
                                ("pipeline-bench", "--width", "old_width")):
        action = _options(subs[name])[old]
        assert action.dest == new_dest and action.help == argparse.SUPPRESS, (name, old)
        assert old not in subs[name].format_help().replace(f"{old}-", "").split(), (name, old)
    args = _parser().parse_args(["demo", "--out-dir", "x"])
    assert args.output == Path("x")
    args = _parser().parse_args(["pipeline-bench", "--warmup", "3"])
    assert args.warmup_items == 3


def test_one_spelling_per_concept() -> None:
    """CUDA graphs, frame size and frame counts are spelled the same in every command that has them."""
    subs = _subparsers()
    for name in ("demo", "detect", "pipeline-bench"):
        opts = _options(subs[name])
        assert "--graphs" in opts and "--no-graphs" in opts, name
        assert opts["--graphs"].dest == opts["--no-graphs"].dest, name
    for name in ("demo", "pipeline-bench"):
        assert _options(subs[name])["--frame-size"].metavar == "WxH", name
    demo, bench = _options(subs["demo"]), _options(subs["pipeline-bench"])
    assert "clip length" in (demo["--frames"].help or "")  # --frames: a clip's length, only there
    assert "--distinct-frames" in bench and bench["--frames"].help == argparse.SUPPRESS
    assert "--compare-graphs" in bench and "--height" not in subs["pipeline-bench"].format_help()


@pytest.mark.parametrize(("argv", "note", "field", "value"), [
    (["detect", "v.mp4", "--out", "a.mp4"], "--out is deprecated; use --output", "output", Path("a.mp4")),
    (["detect", "v.mp4", "--json", "d.jsonl"], "--json is deprecated; use --jsonl", "jsonl", Path("d.jsonl")),
    (["demo", "--out-dir", "d"], "--out-dir is deprecated; use --output", "output", Path("d")),
    (["demo", "--size", "320x192"], "--size is deprecated; use --frame-size", "frame_size", (320, 192)),
    (["pipeline-bench", "--out", "d"], "--out is deprecated; use --output", "output", Path("d")),
    (["pipeline-bench", "--frames", "3"], "--frames is deprecated; use --distinct-frames", "distinct_frames", 3),
    (["pipeline-bench", "--height", "36"], "--height is deprecated; use --frame-size WxH", "old_height", 36),
    (["pipeline-bench", "--graphs", "both"], "--graphs both is deprecated; use --compare-graphs", "graphs", "both"),
    (["pipeline-bench", "--graphs", "on"], "--graphs on is deprecated; use --graphs", "graphs", "on"),
    (["pipeline-bench", "--graphs", "off"], "--graphs off is deprecated; use --no-graphs", "graphs", "off"),
])
def test_an_old_spelling_works_and_warns_once(argv: list[str], note: str, field: str, value: object,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(argv)
    assert getattr(args, field) == value
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"note: {note}"), lines


@pytest.mark.parametrize(("argv", "field", "value"), [
    (["pipeline-bench"], "graphs", "both"), (["pipeline-bench", "--graphs"], "graphs", "on"),
    (["pipeline-bench", "--no-graphs"], "graphs", "off"), (["pipeline-bench", "--compare-graphs"], "graphs", "both"),
    (["pipeline-bench", "--frame-size", "64x36"], "frame_size", (64, 36)),
    (["pipeline-bench", "--distinct-frames", "3"], "distinct_frames", 3),
    (["demo", "--no-graphs"], "cuda_graphs", False), (["demo", "--graphs"], "cuda_graphs", True),
    (["demo", "--frame-size", "320x192"], "frame_size", (320, 192)),
    (["detect", "v.mp4", "--no-graphs"], "cuda_graphs", False), (["detect", "v.mp4", "--graphs"], "cuda_graphs", True),
])
def test_the_new_spellings_work_silently(argv: list[str], field: str, value: object,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert getattr(_parser().parse_args(argv), field) == value
    assert capsys.readouterr().err == ""


def test_a_bad_frame_size_is_one_argparse_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["pipeline-bench", "--frame-size", "1080"])
    assert exc.value.code == 2
    assert "argument --frame-size: must be WxH, e.g. 1280x720, got '1080'" in capsys.readouterr().err


def test_port_help_says_what_0_and_minus_1_do() -> None:
    serve = _options(_subparsers()["serve"])
    for flag in ("--http-port", "--grpc-port", "--metrics-port"):
        assert "0: any free port" in (serve[flag].help or "") and "-1: off" in (serve[flag].help or ""), flag


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
