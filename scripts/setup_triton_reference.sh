#!/usr/bin/env bash
# Makes the venv of the real Triton reference server used by tests/serve/test_triton_differential.py:
# nvidia-pytriton 0.7.0 bundles `tritonserver` 2.51 (python backend only, runs on the CPU) and needs
# numpy<2, so it gets a venv of its own. The test finds it at $STREAMRT_PYTRITON_PYTHON or at
# /work/venvs/pytriton/bin/python, and skips when neither exists. Opt-in: CI does not run this.
#
#   scripts/setup_triton_reference.sh [VENV_DIR]     (default: /work/venvs/pytriton)
set -euo pipefail
venv="${1:-/work/venvs/pytriton}"
python="${PYTHON:-python3}"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q 'nvidia-pytriton==0.7.0' 'numpy<2'
# The smoke check the test relies on: the wheel's tritonserver binary is there and executable.
"$venv/bin/python" - <<'PY'
import pathlib
import pytriton
root = pathlib.Path(pytriton.__file__).parent
server = root / "tritonserver" / "bin" / "tritonserver"
assert server.is_file(), f"no tritonserver binary at {server}"
print(f"pytriton {pytriton.__version__ if hasattr(pytriton, '__version__') else ''} ok: {server}")
PY
echo "reference Triton ready; run: STREAMRT_PYTRITON_PYTHON=$venv/bin/python pytest tests/serve/test_triton_differential.py"
