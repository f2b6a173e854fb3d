"""scripts/spy_summary.py on folded stacks as ``py-spy record --threads --format raw`` writes them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MAIN = "thread (11): MainThread;<module> (streamrt/__main__.py);run_detection (streamrt/video/runner.py)"
LOOP = f"{MAIN};_live (streamrt/video/runner.py)"
GROUP = "thread (12): live-group;Thread.run (threading.py);LiveGroup._run (streamrt/video/live_group.py)"
FOLDED = "\n".join([
    f"{LOOP};Condition.wait (threading.py) 30",
    f"{LOOP};_Tally.handle (streamrt/video/runner.py) 50",
    f"{MAIN};open_detector (streamrt/video/model.py) 20",
    f"{GROUP};ProcessDecodePool.take_ready (streamrt/video/decode_processes.py) 40",
    "not a stack line",
])


def _summary(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "py-spy-threads.txt"
    path.write_text(FOLDED)
    return subprocess.run([sys.executable, str(ROOT / "scripts/spy_summary.py"), str(path), *args],
                          capture_output=True, text=True, timeout=60)


def test_each_threads_time_by_innermost_frame_with_waits_named(tmp_path: Path) -> None:
    done = _summary(tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "140 samples over 2 threads" in out
    assert "## MainThread: 100 samples (71.4% of all), 30% in a wait" in out
    assert "| _Tally.handle (streamrt/video/runner.py) | 50 | 50% |" in out
    assert "## live-group: 40 samples (28.6% of all), 0% in a wait" in out
    assert out.index("## MainThread") < out.index("## live-group")  # the busiest first


def test_under_keeps_the_run_loop_and_skip_waits_its_work(tmp_path: Path) -> None:
    out = _summary(tmp_path, "--under", "_live", "--skip-waits").stdout
    assert "## MainThread: 80 samples" in out and "live-group" not in out and "open_detector" not in out
    assert "Condition.wait" not in out and "| _Tally.handle (streamrt/video/runner.py) | 50 | 62% |" in out
    missing = _summary(tmp_path, "--under", "no_such_function")
    assert missing.returncode == 2 and "no sample has a frame containing 'no_such_function'" in missing.stderr


def test_a_gzipped_profile_reads_as_the_plain_one(tmp_path: Path) -> None:
    import gzip

    path = tmp_path / "py-spy-threads.txt.gz"
    path.write_bytes(gzip.compress(FOLDED.encode()))
    done = subprocess.run([sys.executable, str(ROOT / "scripts/spy_summary.py"), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "140 samples over 2 threads" in done.stdout, done.stderr


def test_subprocess_profiles_name_each_thread_by_its_process(tmp_path: Path) -> None:
    path = tmp_path / "py-spy.txt"
    child = 'process 4242:"python3 -m streamrt.backends.torch_inductor._compile_child /tmp/b/job.json"'
    path.write_text("\n".join([
        'process 11:"python3 benchmarks/engine_speed.py --out x";thread (7): MainThread;main (engine_speed.py) 5',
        f"{child};thread (9): MainThread;compile_package (builder.py);compile_file (codecache.py) 15",
    ]))
    done = subprocess.run([sys.executable, str(ROOT / "scripts/spy_summary.py"), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    child_name = "## pid 4242 (streamrt.backends.torch_inductor._compile_child job.json) MainThread: 15 samples"
    assert child_name in done.stdout
    assert "## pid 11 (benchmarks/engine_speed.py) MainThread: 5 samples" not in done.stdout  # words after argv[0]
    assert "## pid 11 (engine_speed.py x) MainThread: 5 samples" in done.stdout


def test_a_chain_of_processes_and_a_command_over_several_lines_name_the_innermost(tmp_path: Path) -> None:
    """What py-spy 0.4 wrote on the H100 (2026-12-07): every sample starts with its whole chain of processes, and a
    ``python -c`` child's command keeps its newlines."""
    path = tmp_path / "py-spy.txt"
    parent = 'process 525:"";process 551:"/venv/bin/python3 benchmarks/engine_speed.py --worker /tmp/w"'
    probe = ('process 669:"/venv/bin/python3 -c import torch\nfrom ctypes import cdll\n'
             'cdll.LoadLibrary(\'/tmp/x.so\')\n  "')
    path.write_text("\n".join([
        f"{parent};thread (551): MainThread;main (engine_speed.py) 4",
        f"{parent};{probe};thread (669): MainThread;<module> (<string>);LoadLibrary (ctypes/__init__.py) 6",
        'process 525:"";thread (525): MainThread;run (engine_speed.py) 2',
    ]))
    done = subprocess.run([sys.executable, str(ROOT / "scripts/spy_summary.py"), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "12 samples over 3 threads" in done.stdout, done.stdout
    assert "## pid 669 (import torch) MainThread: 6 samples" in done.stdout, done.stdout
    assert "## pid 551 (engine_speed.py w) MainThread: 4 samples" in done.stdout, done.stdout
    assert "## pid 525 () MainThread: 2 samples" in done.stdout, done.stdout
