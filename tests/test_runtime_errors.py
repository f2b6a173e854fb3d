"""streamrt.load and the small command-line tools: messages a user can act on."""

from __future__ import annotations

import dataclasses
import runpy
import sys
from pathlib import Path

import pytest

import streamrt
from helpers import catalogue_file
from streamrt.errors import PlanMismatchError
from streamrt.plan import read_plan, write_plan


def test_mismatch_hint_rebuilds_the_loaded_file_and_names_the_original(tmp_path: Path) -> None:
    src = catalogue_file("matmul", tmp_path)
    built = streamrt.build(src, output=tmp_path / "built.plan", cache=False)
    plan = read_plan(built.path)
    copy = tmp_path / "deploy" / "copy.plan"
    write_plan(copy, dataclasses.replace(plan.manifest, backend_version="0.0.1"), plan.payload)
    with pytest.raises(PlanMismatchError) as info:
        streamrt.load(copy)
    hint = info.value.hint or ""
    assert f"-o {copy}" in hint
    assert f"built from {src} as {built.path}" in hint


def test_testing_models_says_what_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.onnx"
    monkeypatch.setattr(sys, "argv", ["models", "matmul", str(out)])
    monkeypatch.delitem(sys.modules, "streamrt.testing.models", raising=False)
    runpy.run_module("streamrt.testing.models", run_name="__main__")
    assert out.is_file()
    assert f"wrote {out}: matmul" in capsys.readouterr().out
