"""Find why aoti_load_package crashes in fresh processes on the H200 image (issue 4 notes).

Builds one tiny CUDA package, then loads it in fresh subprocesses under different conditions
and reports exit codes, the libstdc++ each process mapped, and what the package's .so needs.
Usage: python scripts/gpu_aoti_diagnose.py OUTDIR
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch


def build(path: Path) -> None:
    from torch._inductor import aoti_compile_and_package

    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).cuda().eval()
    ep = torch.export.export(net, (torch.randn(4, 16, device="cuda"),))
    aoti_compile_and_package(ep, package_path=str(path))


LOAD = r"""
import sys, os
mode = sys.argv[2]
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
y = r(torch.randn(4, 16, device='cuda')); torch.cuda.synchronize()
print('ran ok', tuple(y.shape), flush=True)
"""


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    pkg = out / "tiny.pt2"
    build(pkg)
    print("python:", sys.executable, sys.version.split()[0], "torch", torch.__version__)
    print("torch lib dir:", sorted(p.name for p in (Path(torch.__file__).parent / "lib").glob("libstdc*")))
    with zipfile.ZipFile(pkg) as zf:
        so = [n for n in zf.namelist() if n.endswith(".so")]
        tmp = Path(tempfile.mkdtemp())
        zf.extract(so[0], tmp)
    so_path = tmp / so[0]
    print("ldd of package .so:\n", subprocess.run(["ldd", str(so_path)], capture_output=True, text=True).stdout)
    gxx = subprocess.run(["g++", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True).stdout.strip()
    print("g++ libstdc++:", gxx, os.path.realpath(gxx) if gxx else "")
    needed = subprocess.run(["bash", "-c", f"strings -a {so_path} | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -3"],
                            capture_output=True, text=True).stdout.split()
    print("package needs:", needed)
    for mode in ("plain", "onnxruntime_first", "ensure_cxx_runtime"):
        env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
        res = subprocess.run([sys.executable, "-c", LOAD, str(pkg), mode], capture_output=True, text=True, env=env)
        print(f"--- mode={mode} rc={res.returncode}")
        print(res.stdout.strip())
        print("\n".join(res.stderr.strip().splitlines()[-12:]))


if __name__ == "__main__":
    main()
