"""``streamrt serve``'s exit status (issue 29): 130 after Ctrl-C, 2 when a start-up model fails to
load (Triton's ``--exit-on-error``, default true), a busy port as one line; run as a real process."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest

from streamrt.testing.models import CATALOGUE

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]


def _serve(repo: Path, *flags: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "streamrt.cli.main", "serve", str(repo), "--http-port", "0",
                             "--grpc-port", "0", "--metrics-port", "0", *flags],
                            env=env, stderr=subprocess.PIPE, text=True)


def _lines_until(proc: subprocess.Popen[str], pattern: str, timeout: float = 120.0) -> list[str]:
    """stderr lines up to the first that matches ``pattern`` (fails if the server exits first)."""
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            pytest.fail(f"streamrt serve exited ({proc.wait()}) before {pattern!r}:\n{''.join(lines)[-3000:]}")
        lines.append(line)
        if re.search(pattern, line):
            return lines
    pytest.fail(f"no {pattern!r} within {timeout} s")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "repo" / "cnn" / "1").mkdir(parents=True)
    onnx.save(CATALOGUE["small_cnn"].make(), str(tmp_path / "repo" / "cnn" / "1" / "model.onnx"))
    return tmp_path / "repo"


@pytest.fixture
def broken(repo: Path) -> Path:
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model\n")
    return repo


@pytest.fixture
def cleanup() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_ctrl_c_exits_130(repo: Path, cleanup: list[subprocess.Popen[str]]) -> None:
    proc = _serve(repo)
    cleanup.append(proc)
    lines = _lines_until(proc, r"model 'cnn' ready")
    port = int(re.search(r"http (\d+)", "".join(lines)).group(1))  # type: ignore[union-attr]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=10) as r:
        assert r.status == 200
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130  # docs/errors.md: Ctrl-C is 130, as a shell reports it


def test_a_model_that_fails_to_load_exits_2_by_default(broken: Path, cleanup: list[subprocess.Popen[str]]) -> None:
    proc = _serve(broken)
    cleanup.append(proc)
    assert proc.wait(120) == 2
    last = proc.stderr.read().strip().splitlines()[-1]  # type: ignore[union-attr]
    assert last.startswith("streamrt serve: error: 1 of 2 start-up models failed to load (broken")
    assert "--exit-on-error=false" in last


@pytest.mark.parametrize("flag", ["--exit-on-error=false", "--no-exit-on-error"])
def test_exit_on_error_false_keeps_serving_and_says_what_failed(broken: Path, flag: str,
                                                                cleanup: list[subprocess.Popen[str]]) -> None:
    proc = _serve(broken, flag)
    cleanup.append(proc)
    lines = _lines_until(proc, r"start-up models failed")
    assert "1 of 2 start-up models failed to load (broken); serving the others" in lines[-1]
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130


def test_every_model_failing_is_said_at_the_end_of_start_up(tmp_path: Path,
                                                            cleanup: list[subprocess.Popen[str]]) -> None:
    (tmp_path / "r" / "broken" / "1").mkdir(parents=True)
    (tmp_path / "r" / "broken" / "1" / "model.onnx").write_bytes(b"garbage")
    proc = _serve(tmp_path / "r", "--exit-on-error=false")
    cleanup.append(proc)
    lines = _lines_until(proc, r"no model loaded")
    assert "ERROR" in lines[-1] and "all 1 start-up models failed (broken)" in lines[-1]
    assert "not ready" in lines[-1]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0  # SIGTERM (Kubernetes' stop) is a normal end


def test_exit_on_error_parses_like_tritons() -> None:
    import argparse

    from streamrt.cli.serve import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["serve", "r"]).exit_on_error is True
    for given, value in (("--exit-on-error=false", False), ("--exit-on-error=0", False),
                         ("--exit-on-error=true", True), ("--exit-on-error", True), ("--no-exit-on-error", False)):
        assert parser.parse_args(["serve", "r", given]).exit_on_error is value, given


@pytest.mark.parametrize("frontends", ["1", "2"], ids=["one-process", "2-frontend-processes"])
@pytest.mark.parametrize("busy", ["--grpc-port", "--http-port"])
def test_a_busy_port_is_one_line_naming_the_port_and_the_fix(repo: Path, busy: str, frontends: str) -> None:
    # A process of its own: `streamrt serve` sets process-wide GC and logging settings.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _serve(repo, busy, str(port), "--frontend-processes", frontends)  # the later flag wins over "0"
        assert proc.wait(120) == 2
    err = proc.stderr.read().strip().splitlines()  # type: ignore[union-attr]
    assert "Traceback" not in "\n".join(err), err
    assert len(err) == 1, err  # one line: not gRPC core's own "Failed to add port" line before it
    assert str(port) in err[-1] and "already in use" in err[-1] and f"{busy} 0" in err[-1], err[-1]
