"""scripts/h200_session.sh on the CPU: its dry run, for every part, names scripts, test paths and flags that
exist, so a GPU call cannot die on a renamed file or flag."""

from __future__ import annotations

from pathlib import Path

from dry_run import assert_runnable, dry_run_commands

PARTS = "tests,integrity,examples,zoo,serving,serving2,video,trust,sharing,detens,staging,speed"


def test_every_part_runs_a_script_and_flags_that_exist(tmp_path: Path) -> None:
    commands = dry_run_commands("h200_session.sh", "abc1234", PARTS, OUT=str(tmp_path),
                                SPEED_ARGS="--groups resnet50@32=L5c,max-autotune --lanes 2",
                                SERVING2_ARGS="--models resnet50 --latency-bound-ms 15 --budget-s 200")
    assert len(commands) == len(PARTS.split(",")), commands
    for command in commands:
        assert_runnable(command)
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
