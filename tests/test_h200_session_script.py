"""scripts/h200_session.sh on the CPU: its dry run, for every part, names scripts, test paths and flags that
exist, so a GPU call cannot die on a renamed file or flag."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from dry_run import assert_runnable, dry_run_commands

PARTS = "tests,integrity,examples,nvexamples,zoo,serving,serving2,video,trust,sharing,detens,staging,speed,balance"


def test_every_part_runs_a_script_and_flags_that_exist(tmp_path: Path) -> None:
    commands = dry_run_commands("h200_session.sh", "abc1234", PARTS, OUT=str(tmp_path),
                                SPEED_ARGS="--groups resnet50@32=L5c,max-autotune --lanes 2",
                                SERVING2_ARGS="--models resnet50 --latency-bound-ms 15 --budget-s 200")
    assert len(commands) == len(PARTS.split(",")), commands
    for command in commands:
        assert_runnable(command)
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def _latest_runbook_section() -> str:
    """docs/gpu-verification.md's last dated section (``## 2026-...``): the calls the next session runs."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "gpu-verification.md").read_text()
    sections = re.split(r"^## ", text, flags=re.MULTILINE)
    dated = [s for s in sections if re.match(r"20\d\d-\d\d-\d\d", s)]
    assert dated, "no dated section in docs/gpu-verification.md"
    return dated[-1]


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def test_the_runbooks_next_calls_parse(tmp_path: Path) -> None:
    """Every SERVING_ARGS / SERVING2_ARGS / SPEED_ARGS of the runbook's latest section, word-split as
    h200_session.sh does, is accepted by its script's own parser: on 2026-12-05 a --client-variants value that
    starts with -- needed its '=', and an H200 call must not be the place that finds such a thing out."""
    root = Path(__file__).resolve().parents[1]
    found = re.findall(r'\b(SERVING2?_ARGS|SPEED_ARGS)="([^"]*)"', _latest_runbook_section())
    assert any(name == "SERVING_ARGS" for name, _ in found), found
    serving = _load(root / "scripts" / "gpu_serving_check.py", "_gpu_serving_check_runbook")
    speed = _load(root / "benchmarks" / "engine_speed.py", "_engine_speed_runbook")
    for name, value in found:
        words = value.split()
        if name == "SPEED_ARGS":
            speed.parse_args(["--out", str(tmp_path / "speed"), *words])
        else:
            serving.parse_args([str(tmp_path / "serving"), *words])
    assert not any(tmp_path.iterdir())  # parsing creates nothing


def test_the_runbooks_next_video_calls_parse() -> None:
    """Every VIDEO_ARGS of the runbook's latest section is accepted by scripts/gpu_video_check.py's parser (the
    video call adds --decode-processes 4 --admission queue itself), and every DETECT_ARGS by ``streamrt detect``."""
    from streamrt.cli.main import _parser

    root = Path(__file__).resolve().parents[1]
    section = _latest_runbook_section()
    video = _load(root / "scripts" / "gpu_video_check.py", "_gpu_video_check_runbook").build_parser()
    found = re.findall(r'\bVIDEO_ARGS="([^"]*)"', section)
    for value in found:
        video.parse_args(["out", "--decode-processes", "4", "--admission", "queue", *value.split()])
    detect = _parser()
    given = re.findall(r'\bDETECT_ARGS="([^"]*)"', section)
    for value in given:
        detect.parse_args(["detect", "clip.mp4", *value.split()])
