"""The AOTInductor runner without the GIL (torch_inductor/nogil_runner.py), on the CPU: same outputs as
torch's runner, the GIL given up while the model runs, torch's runner where the package is not one it
knows, and the engine using it."""

from __future__ import annotations

import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import streamrt  # noqa: E402
from helpers import catalogue_file  # noqa: E402
from streamrt.backends.torch_inductor.nogil_runner import RUNNER_ENV, NoGilRunner, open_nogil_runner  # noqa: E402
from streamrt.config import BuildConfig  # noqa: E402
from streamrt.testing.models import CATALOGUE  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


class _Heavy(torch.nn.Module):
    """Long enough per run (~0.3 s on one core) for a spinning thread to show who holds the GIL: with
    torch's runner it gets the switch interval's few ms between runs, without the GIL all the time."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(1024, 1024) for _ in range(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x, x.sum(1)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("nogil")
    exported = torch.export.export(_Heavy().eval(), (torch.randn(2048, 1024),))
    return Path(torch._inductor.aoti_compile_and_package(exported, package_path=str(folder / "heavy.pt2")))


def _torch_runner(package: Path):  # type: ignore[no-untyped-def]
    from torch._inductor.package import load_package

    return load_package(str(package), run_single_threaded=True)


def _spins_during(runs: int, call) -> float:  # type: ignore[no-untyped-def]
    """Iterations a pure-Python thread makes per second while ``call`` runs ``runs`` times."""
    done, count = threading.Event(), [0]

    def spin() -> None:
        while not done.is_set():
            count[0] += 1

    spinner = threading.Thread(target=spin)
    started = time.perf_counter()
    spinner.start()
    for _ in range(runs):
        call()
    done.set()
    spinner.join()
    return count[0] / (time.perf_counter() - started)


def test_same_outputs_as_torchs_runner_and_the_gil_is_given_up(package: Path, tmp_path: Path) -> None:
    runner = open_nogil_runner(package, tmp_path / "x", -1)
    assert isinstance(runner, NoGilRunner) and (runner.num_inputs, runner.num_outputs) == (1, 2)
    reference = _torch_runner(package)
    x = torch.randn(2048, 1024)
    got, want = runner(x), reference(x)
    assert isinstance(got, (tuple, list)) and len(got) == 2  # the call spec's output structure
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the model on one core, the spinner on the other
    try:
        held = _spins_during(3, lambda: reference(x))
        free = _spins_during(3, lambda: runner(x))
    finally:
        torch.set_num_threads(threads)
    assert free > 5 * held, (free, held)  # torch's runner holds the GIL for the whole run
    runner.close()


def test_torchs_runner_where_the_package_is_not_one_it_knows(package: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    odd = tmp_path / "odd.pt2"
    with zipfile.ZipFile(package) as src, zipfile.ZipFile(odd, "w") as dst:
        for name in src.namelist():
            dst.writestr(name, src.read(name))
        model = next(n for n in src.namelist() if n.endswith(".so")).rsplit("/", 1)[0]
        dst.writestr(f"{model}/extern_kernel_nodes.json", "{}")  # a proxy executor's custom operators
    assert open_nogil_runner(odd, tmp_path / "odd", -1) is None
    monkeypatch.setenv(RUNNER_ENV, "torch")
    assert open_nogil_runner(package, tmp_path / "forced", -1) is None


def test_an_engine_runs_on_it_with_the_reference_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = BuildConfig(backend="torch_inductor", backend_options={"device": "cpu"})
    plan = streamrt.build(catalogue_file("dynamic_batch", tmp_path), config, tmp_path / "m.plan", cache=False).path
    model = CATALOGUE["dynamic_batch"]
    inputs = model.inputs(np.random.default_rng(), 3)
    want = model.reference(model.make(), inputs)
    answers = {}
    for kind in ("nogil", "torch"):
        monkeypatch.setenv(RUNNER_ENV, kind)
        ctx = streamrt.load(plan).create_context()
        answers[kind] = ctx.infer(inputs)["y"]
        assert isinstance(ctx._runner(0), NoGilRunner) == (kind == "nogil")
        np.testing.assert_allclose(answers[kind], want["y"], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(answers["nogil"], answers["torch"])


def test_torch_runner_opens_without_load_packages_device_check(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``load_package`` compares device information first, which calls ``pick_vec_isa`` (test programs
    compiled in a fresh process: 48 s of a ResNet-50 plan's 52.6 s load on the H200); the engine's torch
    runner skips it and answers the same."""
    from streamrt.backends.torch_inductor.nogil_runner import open_torch_runner

    x = torch.randn(2048, 1024)
    want = _torch_runner(package)(x)

    def refuse() -> None:
        raise AssertionError("pick_vec_isa called while opening a runner")

    monkeypatch.setattr(torch._inductor.cpu_vec_isa, "pick_vec_isa", refuse)
    got = open_torch_runner(package, -1)(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(AssertionError, match="pick_vec_isa called"):
        _torch_runner(package)  # what the engine used before: the check runs
