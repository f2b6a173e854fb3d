"""Issue 29, a newcomer's first hour: tracebacks that became one line, and messages that misled.

Each test runs the command the newcomer typed and checks the one line it prints now (exit 2, no
traceback, the right words). The read-only cases run in a private mount namespace
(``unshare -rm`` with a read-only tmpfs): a real EROFS, which nothing else in a test can make,
and nothing of it outlives the command; they are skipped where user namespaces are not allowed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import catalogue_file
from streamrt.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ["--min-shapes", "x:1x3x32x32", "--opt-shapes", "x:2x3x32x32", "--max-shapes", "x:4x3x32x32"]


def _one_line(status: int, capsys: pytest.CaptureFixture[str]) -> str:
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err), err
    return err[-1]


@pytest.fixture(scope="module")
def read_only_ok(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip unless a read-only tmpfs can be mounted in a private user + mount namespace."""
    probe = tmp_path_factory.mktemp("probe")
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o ro,size=64k tmpfs "$0" && touch "$0/x"',
                           str(probe)], capture_output=True, text=True, timeout=30)
    if "Read-only file system" not in done.stderr:
        pytest.skip(f"cannot mount a read-only file system here: {done.stderr.strip()[:200]}")


def _on_read_only(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``python ARGV...`` with ``folder`` a read-only file system (for this process only)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o ro,size=64k tmpfs "$0" && shift && '
                           'exec "$@"', str(folder), "_", sys.executable, *argv],
                          capture_output=True, text=True, timeout=240, env=env)


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.stderr.strip().splitlines()[-1]


# --- tracebacks that are one line now -------------------------------------------------------------


@pytest.mark.parametrize(("value", "shown"), [("abc", "'abc'"), ("-3", "-3"), ("1.5", "1.5")])
def test_onnxruntime_threads_option_is_checked(tmp_path: Path, value: str, shown: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    line = _one_line(main(["build", str(src), "-o", str(tmp_path / "x.plan"), "--option", f"threads={value}",
                           "--no-cache"]), capsys)
    assert f"threads must be an integer >= 0 (0 = automatic), got {shown}" in line and "hint:" in line
    assert not (tmp_path / "x.plan").exists()


def test_testing_models_creates_folders_and_writes_nothing_half(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    from streamrt.testing.models import main as write_model

    assert write_model(["small_cnn", str(tmp_path / "new" / "dir" / "cnn.onnx")]) == 0
    assert (tmp_path / "new" / "dir" / "cnn.onnx").stat().st_size > 0
    assert write_model(["small_cnn", str(tmp_path / "new")]) == 2  # a folder: one line, no IsADirectoryError
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m streamrt.testing.models: error: cannot write") and "is a directory" in err[-1]


def test_testing_models_on_a_read_only_folder(tmp_path: Path, read_only_ok: None) -> None:
    line = _last_line(_on_read_only(tmp_path / "ro", "-m", "streamrt.testing.models", "small_cnn",
                                    str(tmp_path / "ro" / "cnn.onnx")))
    assert line.startswith("python -m streamrt.testing.models: error: cannot write") and "read-only file system" in line


def test_testing_calib_on_a_read_only_folder(tmp_path: Path, read_only_ok: None) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    line = _last_line(_on_read_only(tmp_path / "ro", "-m", "streamrt.testing.calib", str(src),
                                    str(tmp_path / "ro" / "calib")))
    assert line.startswith("python -m streamrt.testing.calib: error: cannot write") and "read-only file system" in line


# --- messages that misled --------------------------------------------------------------------------


def test_detect_on_a_file_that_is_not_a_video(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("cv2")
    text = tmp_path / "README.md"
    text.write_text("# not a video\n" * 50)
    line = _one_line(main(["detect", str(text), "--backend", "onnxruntime", "--cache-dir", str(tmp_path / "c")]),
                     capsys)
    assert "not a readable video" in line and "not found" not in line and "Errno" not in line


def test_compare_inputs_with_other_names_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    data = tmp_path / "wrongname.npz"
    np.savez(data, wrongname=np.random.default_rng().standard_normal((2, 3, 32, 32)).astype(np.float32))
    line = _one_line(main(["compare", str(src), str(src), "--inputs", str(data), "--cache-dir",
                           str(tmp_path / "c")]), capsys)
    assert "profile" not in line
    assert f"the arrays in --inputs {data} (wrongname) do not match the inputs of {src} (x)" in line


def test_bench_export_times_on_a_read_only_path_names_that_flag(tmp_path: Path, read_only_ok: None) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    plan = tmp_path / "cnn.plan"
    assert main(["build", str(src), "-o", str(plan), *PROFILE, "--cache-dir", str(tmp_path / "c")]) == 0
    line = _last_line(_on_read_only(tmp_path / "ro", "-m", "streamrt.cli.main", "bench", str(plan), "--duration",
                                    "0.1", "--export-times", str(tmp_path / "ro" / "t.json")))
    assert "read-only file system" in line and "--export-times" in line
    assert "-o/--output" not in line and "permission denied" not in line


def test_build_on_a_read_only_file_system_is_not_called_permission_denied(tmp_path: Path, read_only_ok: None) -> None:
    src = catalogue_file("small_cnn", tmp_path)
    line = _last_line(_on_read_only(tmp_path / "ro", "-m", "streamrt.cli.main", "build", str(src), "-o",
                                    str(tmp_path / "ro" / "x.plan"), "--no-cache"))
    assert "read-only file system" in line and "permission denied" not in line


def test_an_os_error_names_the_flag_that_gave_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The OSError that reaches main (here: EROFS from the times file) is one line naming the flag."""
    import errno

    from streamrt.profiling.bench import BenchResult

    src = catalogue_file("small_cnn", tmp_path)
    target = tmp_path / "out" / "t.json"

    def read_only(self: BenchResult, path: str | Path) -> Path:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(BenchResult, "write_times", read_only)  # the public writer, as a full disk would fail
    line = _one_line(main(["bench", str(src), *PROFILE, "--duration", "0.05", "--export-times", str(target),
                           "--cache-dir", str(tmp_path / "c")]), capsys)
    assert line == (f"streamrt bench: error: {target}: read-only file system (hint: choose a path on a writable "
                    "file system with --export-times)")


@pytest.mark.parametrize("command", ["build", "inspect", "bench", "profile", "compare", "detect"])
def test_a_missing_model_or_plan_is_said_the_same_way(tmp_path: Path, command: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "none.plan"
    argv = {"build": ["build", str(missing), "-o", str(tmp_path / "o.plan")],
            "compare": ["compare", str(missing), str(missing)],
            "detect": ["detect", "synthetic:64x64x2", "--model", str(missing)]}.get(command, [command, str(missing)])
    line = _one_line(main(argv), capsys)
    assert line.startswith(f"streamrt {command}: error: file not found: {missing} (hint: check the path"), line


def test_a_rebuild_hint_names_this_source_not_the_cached_builds(tmp_path: Path) -> None:
    """``build b/m.onnx`` reusing the cache entry of ``a/m.onnx``: its plan's rebuild hint says b/m.onnx."""
    import streamrt
    from streamrt.errors import PlanMismatchError
    from streamrt.plan import read_plan, write_plan

    (tmp_path / "a").mkdir()
    first = catalogue_file("small_cnn", tmp_path / "a")
    assert main(["build", str(first), "-o", str(tmp_path / "a" / "m.plan"), "--cache-dir", str(tmp_path / "c")]) == 0
    (tmp_path / "b").mkdir()
    second = tmp_path / "b" / "small_cnn.onnx"
    shutil.copy(first, second)
    first.unlink()  # the earlier source is gone: a hint naming it cannot be typed
    result = streamrt.build(second, output=tmp_path / "b" / "m.plan", cache_dir=tmp_path / "c")
    assert result.cached
    plan = read_plan(result.path)
    stale = tmp_path / "b" / "old.plan"  # as if built with another onnxruntime
    write_plan(stale, dataclasses.replace(plan.manifest, backend_version="0.0.1"), plan.payload)
    with pytest.raises(PlanMismatchError) as info:
        streamrt.load(stale)
    hint = info.value.hint or ""
    assert f"streamrt build {second} " in hint and str(first) not in hint, hint


# --- example 12's client --------------------------------------------------------------------------


def _client(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(ROOT / "examples" / "12-detection-ensemble" / "client.py"), *argv],
                          capture_output=True, text=True, timeout=120, env=env)


def test_example_12_client_with_a_missing_or_non_image_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jpg"
    assert _last_line(_client(str(missing))) == f"client.py: error: image not found: {missing}"
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert "is not a JPEG or PNG image" in _last_line(_client(str(text)))


def test_example_12_client_without_a_server_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.http")
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = _last_line(_client(str(png), "--url", f"127.0.0.1:{port}"))
    assert line.startswith(f"client.py: error: the server at 127.0.0.1:{port} (http) failed")
