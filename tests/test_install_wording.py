"""One way to install torch, said the same in the errors and the docs; examples end in one line, not a traceback.

The wording lives once, in ``streamrt.errors`` (:func:`streamrt._optional.install_hint`); the README
and examples/README.md must say the same commands. An example run where an extra is hidden (a
``sitecustomize`` that makes ``import torch`` fail as it does where torch is not installed) must end
with one line naming the package and the command, exit status 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamrt._optional import install_hint, missing_dependency
from streamrt.errors import TORCH_CPU_INSTALL, MissingDependencyError

ROOT = Path(__file__).resolve().parents[1]

_HIDE = '''import sys


class _NotInstalled:
    """Any import of these top-level modules fails as it does where they are not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {hidden!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''


def test_the_torch_hint_is_the_extra_and_the_cpu_pin() -> None:
    hint = install_hint("torch")
    assert "pip install 'streamrt[torch]'" in hint and TORCH_CPU_INSTALL in hint
    assert "index-url" not in hint  # PyTorch's own index cannot be reached from many machines
    assert MissingDependencyError("torch", "torch").hint == hint
    assert install_hint("video") == "pip install 'streamrt[video]'"


@pytest.mark.parametrize("doc", ["README.md", "examples/README.md"])
def test_the_docs_say_the_same_commands(doc: str) -> None:
    text = " ".join((ROOT / doc).read_text().split())  # line breaks inside a sentence do not count
    assert "pip install 'streamrt[torch]" in text and f"`{TORCH_CPU_INSTALL}`" in text
    assert "index-url" not in text


def test_a_missing_module_becomes_the_error_naming_its_extra() -> None:
    err = missing_dependency(ModuleNotFoundError("No module named 'torch.nn'", name="torch.nn"))
    assert isinstance(err, MissingDependencyError) and err.extra == "torch" and err.package == "torch"
    cv2 = missing_dependency(ModuleNotFoundError("No module named 'cv2'", name="cv2"))
    assert cv2 is not None and cv2.package == "opencv-python-headless" and cv2.extra == "video"
    assert missing_dependency(ModuleNotFoundError("No module named 'mine'", name="mine")) is None
    assert missing_dependency(ValueError("x")) is None


def _run_hidden(script: str, hidden: set[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_HIDE.format(hidden=sorted(hidden)))
    path = os.pathsep.join(filter(None, [str(site), str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "MPLBACKEND": "Agg", "STREAMRT_EXAMPLES_SMALL": "1",
           "STREAMRT_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, str(ROOT / "examples" / script), "--device", "cpu", "--out",
                           str(tmp_path / "out")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("script", "hidden", "package", "command"), [
    ("01_export_and_build.py", {"torch"}, "torch", TORCH_CPU_INSTALL),  # `import torch` in the script
    ("10_serving.py", {"aiohttp"}, "aiohttp", "pip install 'streamrt[serve]'"),  # MissingDependencyError
])
def test_an_example_without_its_extra_ends_in_one_line(script: str, hidden: set[str], package: str, command: str,
                                                       tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # every example draws; hiding torch alone must be what fails
    proc = _run_hidden(script, hidden, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"{script}: error: the optional package '{package}' is required"), lines[0]
    assert command in lines[0]
