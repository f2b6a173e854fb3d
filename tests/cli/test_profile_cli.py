"""`streamrt profile`: per-node table from ONNX Runtime's profiler, sorted, shares summing to 100 %."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import catalogue_file
from streamrt.backends.base import LayerTiming
from streamrt.cli.main import main
from streamrt.profiling.layers import LayerProfile

PROFILE = ["--min-shapes", "x:1x3x32x32", "--opt-shapes", "x:4x3x32x32", "--max-shapes", "x:8x3x32x32"]


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    return catalogue_file("small_cnn", tmp_path)


def _profile(model: Path, *extra: str) -> list[str]:
    return ["profile", str(model), *PROFILE, "--cache-dir", str(model.parent / "cache"), *extra]


def test_profile_json_is_sorted_and_sums_to_100(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_profile(model, "--json", "--iterations", "5", "--batch", "2")) == 0
    data = json.loads(capsys.readouterr().out)
    layers = data["layers"]
    assert data["iterations"] == 5 and data["shapes"] == {"x": [2, 3, 32, 32]}
    assert len(layers) == data["nodes"] >= 4
    totals = [row["total_ms"] for row in layers]
    assert totals == sorted(totals, reverse=True)
    assert sum(row["share_percent"] for row in layers) == pytest.approx(100.0)
    assert layers[-1]["cumulative_percent"] == pytest.approx(100.0)
    assert all(row["calls"] == 5 for row in layers)
    assert "Conv" in {row["op_type"] for row in layers}
    assert sum(o["share_percent"] for o in data["op_types"]) == pytest.approx(100.0)


def test_profile_table_with_top_n(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_profile(model, "--top", "2")) == 0
    out = capsys.readouterr().out
    assert "=== Per-node profile (10 iterations" in out and "more nodes)" in out
    assert "total" in out and "100.0%" in out and "By op type: " in out
    numbered = [line for line in out.splitlines() if line[:3].strip().isdigit()]
    assert len(numbered) == 2


def test_bad_inputs_exit_2(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "bad.npz", y=np.ones((1, 3, 32, 32), np.float32))
    assert main(_profile(model, "--inputs", str(tmp_path / "bad.npz"))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("streamrt profile: error:") and "'y'" in err[-1]
    assert main(_profile(model, "--top", "-1")) == 2


def test_layer_profile_from_timings() -> None:
    timings = [LayerTiming("b", "Relu", 1.0, 4), LayerTiming("a", "Conv", 3.0, 4), LayerTiming("z", "Add", 0.0, 4)]
    profile = LayerProfile.from_timings(timings, iterations=4)
    assert [r.name for r in profile.rows] == ["a", "b"]  # sorted; nodes without time dropped
    assert [r.share for r in profile.rows] == [75.0, 25.0]
    assert profile.rows[0].per_iteration_ms == 0.75 and profile.per_iteration_ms == 1.0
    assert profile.to_json(top=1)["layers"][0]["name"] == "a"
    assert LayerProfile.from_timings([], 1).format().endswith("By op type: ")
