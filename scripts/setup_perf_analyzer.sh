#!/usr/bin/env bash
# NVIDIA's own load generator, perf_analyzer (C++), as a second client beside `streamrt perf`: the client that
# Triton's published numbers use, and one whose CPU per request is a fraction of a Python client's.
# The last tritonclient wheels that ship it are 2.3x-2.43 (`tritonclient-2.43.0.data/data/bin/perf_analyzer`, built
# for CUDA 12, so CUDA shared memory works); PyPI's `perf-analyzer` is a 0.1.0 placeholder here. It needs libb64
# (Debian's libb64-0d) and libcudart.so.12 (nvidia-cuda-runtime-cu12), both put next to it.
#
#   scripts/setup_perf_analyzer.sh [DIR]     (default: build/perf_analyzer; run DIR/perf_analyzer)
#
# DIR is self-contained (~18 MB): carry it to the GPU machine as is. Opt-in: CI does not run this.
set -euo pipefail
dir="${1:-build/perf_analyzer}"
python="${PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$dir/bin" "$dir/lib"
"$python" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    --python-version 3.12 -d "$tmp" 'tritonclient==2.43.0' 'nvidia-cuda-runtime-cu12==12.9.79'
(cd "$tmp" && apt-get download -q libb64-0d >/dev/null 2>&1) || { echo "apt-get download libb64-0d failed" >&2; exit 1; }
"$python" - "$tmp" "$dir" <<'PY'
import pathlib, shutil, sys, zipfile
tmp, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wanted = {"tritonclient": ("tritonclient-2.43.0.data/data/bin/perf_analyzer", out / "bin" / "perf_analyzer"),
          "nvidia_cuda_runtime": ("nvidia/cuda_runtime/lib/libcudart.so.12", out / "lib" / "libcudart.so.12")}
for wheel in tmp.glob("*.whl"):
    for prefix, (member, target) in wanted.items():
        if wheel.name.startswith(prefix):
            with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            target.chmod(0o755)
PY
dpkg-deb -x "$tmp"/libb64-0d_*.deb "$tmp/deb"
cp -L "$tmp"/deb/usr/lib/x86_64-linux-gnu/libb64.so.0d "$dir/lib/"
cat > "$dir/perf_analyzer" <<'SH'
#!/bin/sh
# perf_analyzer with the libraries next to it (scripts/setup_perf_analyzer.sh)
d="$(dirname "$(readlink -f "$0")")"
LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/bin/perf_analyzer" "$@"
SH
chmod +x "$dir/perf_analyzer"
if LD_LIBRARY_PATH="$dir/lib" ldd "$dir/bin/perf_analyzer" | grep -q "not found"; then
    LD_LIBRARY_PATH="$dir/lib" ldd "$dir/bin/perf_analyzer" | grep "not found" >&2; exit 1
fi
"$dir/perf_analyzer" --version 2>&1 | head -1 || true
echo "perf_analyzer ready: $dir/perf_analyzer"
