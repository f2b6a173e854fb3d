#!/usr/bin/env bash
# Installs the test dependencies into .venv and runs the linter, the type checker and every test.
# torch is pinned: any other request pulls a multi-GB CUDA build on CPU-only machines.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]' 'torch==2.13.0'
.venv/bin/ruff check src tests benchmarks scripts
.venv/bin/mypy
# NVIDIA's perf_analyzer for the tests that measure with it beside `streamrt perf` (best effort: they skip or
# report a failed row without it)
[ -x build/perf_analyzer/perf_analyzer ] \
    || PYTHON=.venv/bin/python bash scripts/setup_perf_analyzer.sh build/perf_analyzer > /dev/null 2>&1 \
    || echo "perf_analyzer not set up (scripts/setup_perf_analyzer.sh): its tests skip"
.venv/bin/pytest -q "$@"
# The Triton kernels on Triton's CPU interpreter (read at import, so a run of its own); the whole suite only
if [ $# -eq 0 ] && .venv/bin/python -c "import triton" 2> /dev/null; then
    TRITON_INTERPRET=1 .venv/bin/pytest -q tests/ops/test_triton_interpret.py tests/ops/test_triton_postprocess.py \
        tests/ops/test_nv12.py
fi
