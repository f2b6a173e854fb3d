"""The "Quick start" sections of README.md and docs/*.md, run as written on the CPU in a temp dir.

Every fenced block of a "## Quick start" section runs, in order, in one bash session (so ``cd``
carries over): ``bash`` blocks as they are, ``python`` blocks through ``python -``, and a block
whose first line is a comment naming a file (``# models/cnn/config.yaml``) is written to that file.
Markers the docs may put at the end of a command line:

- ``# on a GPU machine``: skipped where torch sees no CUDA device.
- ``# keeps running``: a server; started in the background, waited for until ready, stopped at the end.

Blocks in other languages (``console`` transcripts, tree drawings without a language) are not run.

A section that activates the checkout's virtualenv (``source .venv/bin/activate``, what a reader
does after the README's first command, ``bash scripts/demo.sh``) runs in a fresh shell: PATH
without this interpreter's virtualenv, no VIRTUAL_ENV, and a ``.venv`` in the working directory
that is this interpreter's virtualenv. So a command that works only in an already activated shell
fails here as it does for a reader. (The sources under test still come first through PYTHONPATH.)
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_MARK = "# on a GPU machine"
ACTIVATE = "source .venv/bin/activate"
SERVER_MARK = "# keeps running"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_FILE_COMMENT = re.compile(r"^#\s*([\w./-]+\.\w+)\b")
_READY = (
    'python -c "import time, urllib.request as u\n'
    "for _ in range(240):\n"
    "    try: u.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=1); break\n"
    "    except Exception: time.sleep(0.5)\n"
    "else: raise SystemExit('server not ready after 120 s')\"\n"
)

pytestmark = pytest.mark.timeout(600)


def quick_start(path: Path) -> str | None:
    """The text of the file's "## Quick start" section, or None."""
    text = path.read_text(encoding="utf-8")
    m = re.search(r"^## Quick start\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m.group(1) if m else None


def _logical_lines(code: str) -> list[str]:
    lines: list[str] = []
    for line in code.splitlines():
        if lines and lines[-1].endswith("\\"):
            lines[-1] += "\n" + line
        else:
            lines.append(line)
    return lines


def to_script(section: str, *, gpu: bool) -> str:
    """One bash script running the section's blocks in order (see the module docstring)."""
    out = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT"]
    for lang, code in _FENCE.findall(section):
        first = code.splitlines()[0] if code.strip() else ""
        named = _FILE_COMMENT.match(first)
        if lang == "bash":
            for line in _logical_lines(code):
                if GPU_MARK in line and not gpu:
                    out.append(f": skipped, GPU only: {shlex.quote(line.strip())}")
                elif SERVER_MARK in line:
                    out.append(f"{line.split('#')[0].strip()} &")
                    out.append(_READY)
                else:
                    out.append(line)
        elif lang == "python":
            out.append(f"python - <<'STREAMRT_PY'\n{code}STREAMRT_PY")
        elif named:
            out.append(f"mkdir -p \"$(dirname {named.group(1)})\"")
            out.append(f"cat > {named.group(1)} <<'STREAMRT_FILE'\n{code}STREAMRT_FILE")
    return "\n".join(out) + "\n"


def _documents() -> list[Path]:
    return [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if quick_start(p)]


def _gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def fresh_shell_env(work: Path) -> dict[str, str]:
    """The environment of a new terminal in a checkout where ``bash scripts/demo.sh`` made ``.venv``.

    ``work/.venv`` links to this interpreter's virtualenv; PATH loses every entry inside it.
    """
    venv = Path(sys.prefix)
    if sys.prefix == sys.base_prefix or not (venv / "bin" / "activate").is_file():
        pytest.skip("not running from a virtualenv: no .venv/bin/activate to source")
    (work / ".venv").symlink_to(venv, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    kept = [d for d in env.get("PATH", "").split(os.pathsep)
            if d and not Path(d).resolve().is_relative_to(venv.resolve())]
    env["PATH"] = os.pathsep.join(kept)
    return env


def _port_busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_docs_have_quick_starts() -> None:
    names = {p.name for p in _documents()}
    assert {"README.md", "serving.md"} <= names


def test_the_readme_quick_start_activates_the_venv_first() -> None:
    """Its first command runs in the shell that ran ``bash scripts/demo.sh``: nothing is on PATH yet."""
    section = quick_start(ROOT / "README.md")
    assert section is not None
    first = next(line for lang, code in _FENCE.findall(section) if lang == "bash" for line in code.splitlines()
                 if line.strip() and not line.startswith("#"))
    assert first.split("#")[0].strip() == ACTIVATE


def test_markers_are_translated() -> None:
    section = (
        "```bash\nstreamrt a \\\n  --x 1\nstreamrt b   # on a GPU machine\nstreamrt serve m   # keeps running\n```\n"
    )
    script = to_script(section, gpu=False)
    assert "streamrt a \\\n  --x 1" in script and ": skipped, GPU only: 'streamrt b" in script
    assert "streamrt serve m &" in script and "health/ready" in script
    assert "streamrt b   #" in to_script(section, gpu=True)


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_quick_start_runs_as_written(doc: Path, tmp_path: Path) -> None:
    section = quick_start(doc)
    assert section is not None
    if SERVER_MARK in section and _port_busy(8000):
        pytest.skip("port 8000 is taken on this machine; the quick start serves there")
    if ACTIVATE in section:
        env = fresh_shell_env(tmp_path)
        unactivated = subprocess.run(["bash", "-c", "command -v streamrt"], env=env, capture_output=True)
        assert unactivated.returncode != 0, "the fresh shell already finds streamrt: the test could not fail"
    else:
        env = dict(os.environ)
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["STREAMRT_CACHE"] = str(tmp_path / "cache")
    env["MPLBACKEND"] = "Agg"
    script = to_script(section, gpu=_gpu())
    proc = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540,
        start_new_session=True,
    )
    logs = f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"{doc.name} quick start failed:\n{script}\n{logs}"
