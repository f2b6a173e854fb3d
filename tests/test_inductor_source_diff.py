"""scripts/inductor_source_diff.py: what differs between near-identical generated sources (why a rebuild's Triton
template candidates miss the timing cache)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TEMPLATE = """import triton
@triton_heuristics.template(
    num_stages={stages},
    triton_meta={{'signature': {{'arg_A': '*fp16', 'arg_B': '*fp16'}}, 'configs': [{align}]}},
    inductor_meta={{'kernel_name': 'triton_mm', 'backend_hash': 'abc'}},
)
@triton.jit
def triton_mm(arg_A, arg_B, out_ptr0):
    BLOCK_M : tl.constexpr = {block}
    acc = tl.dot(a, b)
"""


def _write(folder: Path, name: str, **fields: object) -> None:
    path = folder / name[:2] / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TEMPLATE.format(**fields))


def test_the_line_that_differs_between_two_builds_is_named_most_frequent_first(tmp_path: Path) -> None:
    for block in (32, 64, 128):  # build 1 and build 2 of three candidates: only the alignment line differs
        _write(tmp_path, f"c1{block}", stages=3, block=block, align="'tt.divisibility', 16")
        _write(tmp_path, f"c2{block}", stages=3, block=block, align="")
    (tmp_path / "other.py").write_text("def pointwise(): pass\n")  # not a template: not read
    done = subprocess.run([sys.executable, str(ROOT / "scripts/inductor_source_diff.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "6 generated sources with '@triton_heuristics.template'" in out, out
    lines = out.splitlines()
    first = lines[lines.index(next(line for line in lines if "most frequent first" in line)) + 1]
    assert "configs" in first and ("3x" in first), out  # each of the three pairs differs in that line
    assert "example (" in out


def test_nothing_to_compare_is_said(tmp_path: Path) -> None:
    _write(tmp_path, "c1", stages=3, block=32, align="")
    done = subprocess.run([sys.executable, str(ROOT / "scripts/inductor_source_diff.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "nothing to compare" in done.stdout, done.stdout + done.stderr
