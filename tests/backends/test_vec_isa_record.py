"""The CPU vector-ISA probe's test builds recorded once per cache directory: a later compile builds none and gets the
same ISA."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from streamrt.backends.torch_inductor import vec_isa
from streamrt.backends.torch_inductor.vec_isa import RECORD, recorded_check_builds

cpu_isa = pytest.importorskip("torch._inductor.cpu_vec_isa")

# an extension test's program, as VNNI's and AMX's are: an ISA whose base test passed builds another with more flags
EXTENSION_TEST = "extern \"C\" int streamrt_extension_check(int a) { return a + 1; }\n"


def _forget_probe() -> None:
    """A new process, as far as the probe knows: its per-process caches cleared."""
    cpu_isa.valid_vec_isa_list.cache_clear()
    for isa in getattr(cpu_isa, "supported_vec_isa_list", []):
        for name in ("__bool__", "_VecISA__bool__impl"):
            clear = getattr(getattr(type(isa), name, None), "cache_clear", None)
            if clear:
                clear()


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    _forget_probe()
    yield tmp_path
    _forget_probe()


def _builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count the test builds that really run from here on (``VecISA.check_build`` under the record's answers)."""
    calls: list[str] = []
    original = cpu_isa.VecISA.check_build

    def counted(self: Any, code: str) -> bool:
        calls.append(str(self))
        return bool(original(self, code))

    monkeypatch.setattr(cpu_isa.VecISA, "check_build", counted)
    return calls


def _an_isa() -> Any:
    """An ISA this CPU builds, or skip."""
    valid = cpu_isa.valid_vec_isa_list()
    if not valid:
        pytest.skip("no vector ISA on this CPU: nothing is recorded")
    return valid[-1]


def test_the_first_compile_records_the_probe_and_the_next_builds_no_test(
        cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrt.backends.torch_inductor.builder import compile_package

    ep = torch.export.export(torch.nn.Linear(8, 4).eval(), (torch.randn(2, 8),))
    _forget_probe()
    first = _builds(monkeypatch)
    compile_package(ep, {})
    probed = str(cpu_isa.pick_vec_isa())
    if probed == "INVALID_VEC_ISA":
        pytest.skip("no vector ISA on this CPU: nothing is recorded")
    assert first, "the first compile in a cache directory probes"
    record = json.loads((cache_dir / RECORD).read_text())
    assert record["identity"] == vec_isa.identity() and record["passed"]

    _forget_probe()
    again = _builds(monkeypatch)
    package = compile_package(ep, {})
    assert again == []  # every test build answered from the record: none built, none loaded
    assert str(cpu_isa.pick_vec_isa()) == probed  # and the same ISA picked
    assert package[:2] == b"PK"  # a whole .pt2 (a zip)


def test_an_extension_test_is_answered_from_the_record_too(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What 'cpp.vec_isa_ok' (the first version) missed on the H100: the extension tests (VNNI, AMX, AVX-512 BF16)
    after an ISA's base test, with flags of their own."""
    isa = _an_isa()
    with recorded_check_builds():
        assert cpu_isa.VecISA.check_build(isa, EXTENSION_TEST)
    built = _builds(monkeypatch)
    with recorded_check_builds():
        assert cpu_isa.VecISA.check_build(isa, EXTENSION_TEST)
        isa._arch_flags += " -DSTREAMRT_OTHER_FLAGS"  # another flag set is another test: built
        try:
            assert cpu_isa.VecISA.check_build(isa, EXTENSION_TEST)
        finally:
            isa._arch_flags = isa._arch_flags.replace(" -DSTREAMRT_OTHER_FLAGS", "")
    assert built == [str(isa)]
    assert cpu_isa.VecISA.check_build.__name__ == "counted"  # the block put back what it replaced


def test_a_failed_test_is_not_recorded(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isa = _an_isa()
    with recorded_check_builds():
        assert not cpu_isa.VecISA.check_build(isa, "this is not C++\n")
    built = _builds(monkeypatch)
    with recorded_check_builds():
        assert not cpu_isa.VecISA.check_build(isa, "this is not C++\n")
    assert built == [str(isa)]  # built again: a failure may have had a passing cause


def test_a_record_of_another_machine_or_unreadable_is_not_used(
        cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isa = _an_isa()
    key = vec_isa.check_key(isa, EXTENSION_TEST)
    built = _builds(monkeypatch)
    for text in (json.dumps({"identity": "another machine", "passed": [key]}), "not json", "[]"):
        (cache_dir / RECORD).write_text(text)
        with recorded_check_builds():
            cpu_isa.VecISA.check_build(isa, EXTENSION_TEST)
    assert len(built) == 3
    assert json.loads((cache_dir / RECORD).read_text())["identity"] == vec_isa.identity()  # rewritten for here


def test_a_compiler_upgraded_in_place_probes_again(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor import cpp_builder

    isa = _an_isa()
    with recorded_check_builds():
        assert cpu_isa.VecISA.check_build(isa, EXTENSION_TEST)
    built = _builds(monkeypatch)
    monkeypatch.setattr(cpp_builder, "get_compiler_version_info", lambda compiler: "gcc version 99.1.0")
    with recorded_check_builds():
        cpu_isa.VecISA.check_build(isa, EXTENSION_TEST)
    assert built == [str(isa)]  # same path, another compiler version: the recorded answer is not trusted


def test_the_off_switch_builds_every_test(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isa = _an_isa()
    with recorded_check_builds():
        cpu_isa.VecISA.check_build(isa, EXTENSION_TEST)
    built = _builds(monkeypatch)
    monkeypatch.setenv(vec_isa.OFF_SWITCH, "0")
    with recorded_check_builds():
        cpu_isa.VecISA.check_build(isa, EXTENSION_TEST)
    assert built == [str(isa)]
