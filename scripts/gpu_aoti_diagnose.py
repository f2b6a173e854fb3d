"""Find why aoti_load_package crashes in fresh processes on the H200 image (issue 4 notes).

Builds one tiny CUDA package, then loads it in fresh subprocesses under different conditions
and reports exit codes, the libstdc++ each process mapped, and what the package's .so needs.
Usage: python scripts/gpu_aoti_diagnose.py OUTDIR [--device cpu]

``--device cpu`` is the smoke run (tests/test_gpu_scripts_smoke.py): the same steps with a CPU package.
Each load mode is reported on its own (a crash is its exit code); a step that fails says so and the
next one runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch


def build(path: Path, device: str = "cuda") -> None:
    from torch._inductor import aoti_compile_and_package

    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).to(device).eval()
    ep = torch.export.export(net, (torch.randn(4, 16, device=device),))
    aoti_compile_and_package(ep, package_path=str(path))


LOAD = r"""
import sys, os
mode, device = sys.argv[2], sys.argv[3]
if mode == "onnxruntime_first":
    import onnxruntime
if mode == "ensure_cxx_runtime":
    from streamrt.backends.torch_inductor.engine import ensure_cxx_runtime
    ensure_cxx_runtime()
import torch
def maps():
    return sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libstdc++' in l or 'libgcc_s' in l})
print('before load:', maps(), flush=True)
from torch._inductor import aoti_load_package
r = aoti_load_package(sys.argv[1])
print('after load:', maps(), flush=True)
y = r(torch.randn(4, 16, device=device))
if device == 'cuda':
    torch.cuda.synchronize()
print('ran ok', tuple(y.shape), flush=True)
"""


def _step(name: str, fn: Callable[[], None]) -> None:
    """Run one diagnostic step; a failure is printed and the next step runs."""
    try:
        fn()
    except Exception as exc:  # a diagnosis script reports everything it can
        print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)


def _package_so(pkg: Path) -> None:
    with zipfile.ZipFile(pkg) as zf:
        so = [n for n in zf.namelist() if n.endswith(".so")]
        if not so:
            print("package .so: none in", pkg.name, flush=True)
            return
        tmp = Path(tempfile.mkdtemp())
        zf.extract(so[0], tmp)
    so_path = tmp / so[0]
    print("ldd of package .so:\n", subprocess.run(["ldd", str(so_path)], capture_output=True, text=True).stdout)
    gxx = subprocess.run(["g++", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True).stdout.strip()
    print("g++ libstdc++:", gxx, os.path.realpath(gxx) if gxx else "")
    needed = subprocess.run(["bash", "-c", f"strings -a {so_path} | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -3"],
                            capture_output=True, text=True).stdout.split()
    print("package needs:", needed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("out", type=Path, nargs="?", default=None, help="folder for the package (default: a temp one)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    pkg = out / "tiny.pt2"
    build(pkg, args.device)  # nothing below means anything without the package: let this one raise
    print("python:", sys.executable, sys.version.split()[0], "torch", torch.__version__)
    print("torch lib dir:", sorted(p.name for p in (Path(torch.__file__).parent / "lib").glob("libstdc*")))
    _step("package .so", lambda: _package_so(pkg))
    codes = {}
    for mode in ("plain", "onnxruntime_first", "ensure_cxx_runtime"):
        env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
        res = subprocess.run([sys.executable, "-c", LOAD, str(pkg), mode, args.device], capture_output=True,
                             text=True, env=env)
        codes[mode] = res.returncode
        print(f"--- mode={mode} rc={res.returncode}")
        print(res.stdout.strip())
        print("\n".join(res.stderr.strip().splitlines()[-12:]))
    print("summary:", ", ".join(f"{mode} rc={code}" for mode, code in codes.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
