"""The CPU vector-ISA probe recorded once per cache directory: a later compile skips it and gets the same ISA."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from streamrt.backends.torch_inductor import vec_isa
from streamrt.backends.torch_inductor.vec_isa import RECORD, record_probed_isa, recorded_isa_configs

cpu_isa = pytest.importorskip("torch._inductor.cpu_vec_isa")


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    cpu_isa.valid_vec_isa_list.cache_clear()
    yield tmp_path
    cpu_isa.valid_vec_isa_list.cache_clear()


def _probes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count the probe's test builds from here on (each ISA's ``check_build``)."""
    calls: list[str] = []
    original = cpu_isa.VecISA.check_build

    def counted(self: Any, code: str) -> bool:
        calls.append(str(self))
        return bool(original(self, code))

    monkeypatch.setattr(cpu_isa.VecISA, "check_build", counted)
    return calls


def test_the_first_compile_records_the_probe_and_the_next_skips_it(
        cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrt.backends.torch_inductor.builder import compile_package

    probed = str(cpu_isa.pick_vec_isa())
    if probed == "INVALID_VEC_ISA":
        pytest.skip("no vector ISA on this CPU: nothing is recorded")
    ep = torch.export.export(torch.nn.Linear(8, 4).eval(), (torch.randn(2, 8),))
    compile_package(ep, {})
    record = json.loads((cache_dir / RECORD).read_text())
    assert record["isa"] == probed and record["bits"] == cpu_isa.pick_vec_isa().bit_width()
    assert record["identity"] == vec_isa.identity()

    cpu_isa.valid_vec_isa_list.cache_clear()  # a new process, as far as the probe knows
    probes = _probes(monkeypatch)
    configs = recorded_isa_configs()
    assert configs == {"cpp.vec_isa_ok": True, "cpp.simdlen": record["bits"]} and probes == []
    package = compile_package(ep, {})
    assert probes == []  # the compile did not probe
    assert package[:2] == b"PK"  # a whole .pt2 (a zip)


def test_a_record_of_another_machine_or_isa_is_not_used(cache_dir: Path) -> None:
    (cache_dir / RECORD).write_text(json.dumps({"identity": "another machine", "isa": "avx2", "bits": 256}))
    assert recorded_isa_configs() == {}
    (cache_dir / RECORD).write_text(json.dumps({"identity": vec_isa.identity(), "isa": "no such isa", "bits": 256}))
    assert recorded_isa_configs() == {}  # what the configs would pick is not what was recorded: probe
    (cache_dir / RECORD).write_text("not json")
    assert recorded_isa_configs() == {}


def test_the_off_switch_probes_as_torch_does(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record_probed_isa()
    if not (cache_dir / RECORD).is_file():
        pytest.skip("no vector ISA on this CPU: nothing is recorded")
    assert recorded_isa_configs() != {}
    cpu_isa.valid_vec_isa_list.cache_clear()
    monkeypatch.setenv(vec_isa.OFF_SWITCH, "0")
    assert recorded_isa_configs() == {}


def test_an_existing_record_is_kept(cache_dir: Path) -> None:
    (cache_dir / RECORD).write_text(json.dumps({"identity": "x", "isa": "y", "bits": 1}))
    record_probed_isa()
    assert json.loads((cache_dir / RECORD).read_text())["identity"] == "x"
