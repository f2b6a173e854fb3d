"""The issue-27 H200 call script (scripts/h200_video_call.sh) on the CPU: its dry run names scripts and
flags that exist, and its packing step (scripts/h200_pack.sh) keeps the reports and drops the rest."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from dry_run import assert_runnable, dry_run_commands

ROOT = Path(__file__).resolve().parents[2]


ALL_STEPS = "tests,reruns,video,nvdec,videotests,detectcli,runners,speed,enginepath,profile"


@pytest.mark.parametrize("steps", [None, ALL_STEPS])
def test_dry_run_names_existing_scripts_with_flags_they_accept(tmp_path: Path, steps: str | None) -> None:
    chosen = {"STEPS": steps} if steps else {}
    commands = dry_run_commands("h200_video_call.sh", "abc1234", OUT=str(tmp_path), **chosen)
    # nvdec, detectcli, runners, speed, enginepath and profile (+ sources) only when asked
    assert len(commands) == (11 if steps else 4), commands
    for command in commands:
        assert_runnable(command)


def test_detect_profile_runs_the_cli_under_py_spy_once_per_mode(tmp_path: Path) -> None:
    """DETECT_PROFILE=threads,gil (issue 27: what the consumer does while the GPU idles 20-63 ms between calls at 156
    streams) runs the CLI under ``py-spy record`` twice: every thread with its waits, then the GIL's holder only;
    folded stacks and a report per mode under detectcli/."""
    commands = dry_run_commands("h200_video_call.sh", "abc1234", OUT=str(tmp_path), STEPS="detectcli",
                                DETECT_PROFILE="threads,gil")
    assert len(commands) == 2, commands
    for command, mode, sampled in zip(commands, ("threads", "gil"), ("--idle", "--gil"), strict=True):
        spy, _, cli = command.partition(" -- ")
        assert spy.split()[1:] == ["record", "--threads", sampled, "--nonblocking", "--nolineno", "--rate", "100",
                                   "--format", "raw", "--output", f"{tmp_path}/detectcli/py-spy-{mode}.txt"], spy
        assert cli.startswith("python3 -m streamrt detect ") and cli.endswith(f"/detectcli/report-{mode}")
        assert_runnable(cli)
    (plain,) = dry_run_commands("h200_video_call.sh", "abc1234", OUT=str(tmp_path), STEPS="detectcli")
    assert plain.startswith("python3 -m streamrt detect ") and plain.endswith("/detectcli/report")


def test_a_machine_where_streamrt_does_not_import_stops_the_call_in_one_line(tmp_path: Path) -> None:
    """2026-12-04: a call without .whl-video/ (cattrs is not on the H200 image) ran every step into the same
    ModuleNotFoundError; the script now stops before its first step and says what to carry."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"  # a python3 that cannot import streamrt, as the image's without cattrs
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'cattrs'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    out_dir = tmp_path / "out"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(out_dir), "STEPS": "speed,profile"}
    work = tmp_path / "checkout"  # no .whl-video/ there, as in a call that forgot it
    work.mkdir()
    run = subprocess.run(["bash", str(ROOT / "scripts/h200_video_call.sh"), "abc1234"], cwd=work, capture_output=True,
                         text=True, env=env, timeout=60)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert "streamrt does not import here: ModuleNotFoundError: No module named 'cattrs'; carry .whl-video/" \
        in run.stdout
    assert "== " not in run.stdout and not (out_dir / "speed").exists()  # no step ran


def test_pack_keeps_reports_and_drops_videos_and_large_files(tmp_path: Path) -> None:
    (tmp_path / "video").mkdir()
    (tmp_path / "video" / "report.md").write_text("# report\n")
    (tmp_path / "video" / "clip.mp4").write_bytes(b"x" * 100)
    (tmp_path / "video" / "big.log").write_bytes(b"x" * (5 * 2**20))
    subprocess.run(["bash", "scripts/h200_pack.sh", str(tmp_path)], cwd=ROOT, check=True, capture_output=True)
    assert [p.name for p in tmp_path.iterdir()] == ["h200.tar.gz"]
    with tarfile.open(tmp_path / "h200.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert "report.md" in names and "clip.mp4" not in names and "big.log" not in names


def test_pack_drops_build_scratch_and_falls_back_to_the_reports_when_too_big(tmp_path: Path) -> None:
    """A call whose tarball would exceed what comes back (2026-12-03: 53 MB of --keep-scratch caches, nothing
    returned) still returns its reports."""
    speed = tmp_path / "speed"
    (speed / "scratch" / "cache").mkdir(parents=True)
    (speed / "scratch" / "cache" / "kernel.so").write_bytes(os.urandom(100_000))
    (speed / "engine-speed.md").write_text("| table |\n")
    (speed / "noise.bin").write_bytes(os.urandom(300_000))  # incompressible, under 4 MB: kept unless too big
    env = {**os.environ, "PACK_LIMIT_BYTES": "200000"}
    run = subprocess.run(["bash", "scripts/h200_pack.sh", str(tmp_path)], cwd=ROOT, check=True, capture_output=True,
                         text=True, env=env)
    assert "packing only the reports" in run.stdout
    with tarfile.open(tmp_path / "h200.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert "engine-speed.md" in names and "noise.bin" not in names and "kernel.so" not in names


def test_speed_profile_runs_the_benchmark_and_its_compile_children_under_py_spy(tmp_path: Path) -> None:
    """SPEED_PROFILE=1 (issue 28: where a rebuild's 58 s go) samples the benchmark with every process it starts."""
    commands = dry_run_commands("h200_video_call.sh", "abc1234", OUT=str(tmp_path), STEPS="speed", SPEED_PROFILE="1")
    assert len(commands) == 1, commands
    spy, _, benchmark = commands[0].partition(" -- ")
    assert spy.endswith(f"py-spy record --subprocesses --threads --idle --nonblocking --nolineno --rate 50 --format "
                        f"raw --output {tmp_path}/speed/py-spy.txt"), spy
    assert_runnable(benchmark)
