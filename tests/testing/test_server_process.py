"""server_process: readiness of a real HTTP server, a clear failure when it dies, a stop that always ends it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrt.testing.server_process import free_port, stop, wait_ready

pytestmark = pytest.mark.timeout(60)

READY_SERVER = """
import http.server, sys
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v2/health/ready" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ready).serve_forever()
"""


def test_wait_ready_returns_once_the_server_answers_and_stop_ends_it() -> None:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", READY_SERVER, str(port)])
    try:
        wait_ready(port, 30, process)
    finally:
        status = stop(process)
    assert status is not None and process.poll() is not None


def test_a_server_that_exits_first_fails_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("error: no model repository at /nowhere\n")
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match=r"(?s)exited \(3\).*no model repository"):
        wait_ready(free_port(), 30, process, log=log)


def test_a_server_that_never_answers_times_out() -> None:
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"not ready after 0\.5 s"):
        wait_ready(free_port(), 0.5, poll_s=0.1)
    assert time.monotonic() - t0 < 10


def test_stop_kills_a_process_that_ignores_sigterm() -> None:
    ignore = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
              "time.sleep(60)")
    process = subprocess.Popen([sys.executable, "-c", ignore], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline().strip() == b"up"
    t0 = time.monotonic()
    stop(process, timeout=0.5)
    assert process.poll() is not None and time.monotonic() - t0 < 15


def test_stop_kills_the_children_of_a_server_that_ignores_sigterm() -> None:
    """A server with ``--frontend-processes`` workers that does not exit: its workers must not outlive it
    (on the device machine they would hold the ports and the GPU for the next part)."""
    import os

    from streamrt.testing.server_process import child_pids

    worker = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    parent = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              f"subprocess.Popen([sys.executable, '-c', {worker!r}]); print('up', flush=True); time.sleep(60)")
    process = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline().strip() == b"up"
    deadline = time.monotonic() + 10
    while not (children := child_pids(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(children) == 1, children
    stop(process, timeout=0.5)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{children[0]}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break  # killed, waiting for init to reap it
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(children[0], 9)
        raise AssertionError("the server's child outlived stop()")
