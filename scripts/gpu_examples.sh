#!/usr/bin/env bash
# Run the examples of examples/ with --device cuda; outputs and one log per example under OUT_DIR.
#   bash scripts/gpu_examples.sh OUT_DIR [NN ...]     (NN: only these examples, e.g. 01 02)
# Builds go through $STREAMRT_CACHE: keep it between calls so a second call reuses the plans.
# Writes OUT_DIR/NN/ (each example's figures), OUT_DIR/NN.log and OUT_DIR/summary.txt
# (example, exit status, seconds). Record the results in docs/examples-h200.md.
set -uo pipefail
out=${1:?usage: bash scripts/gpu_examples.sh OUT_DIR [NN ...]}
shift
only=" $* "
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg PYTHONUNBUFFERED=1
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "error: these runs need torch with a CUDA GPU (python3 -c 'import torch; print(torch.cuda.is_available())')" >&2
  exit 2
fi
{
  echo "commit: ${STREAMRT_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  "$PYTHON" -c "import torch; print('device:', torch.cuda.get_device_name(), '| torch', torch.__version__)"
} >> "$out/summary.txt"
failed=0
for script in "$root"/examples/[0-9][0-9]_*.py; do
  name=$(basename "$script" .py)
  [ "$only" = "  " ] || [[ "$only" == *" ${name:0:2} "* ]] || continue
  start=$(date +%s)
  "$PYTHON" "$script" --device cuda --out "$out/${name:0:2}" > "$out/${name:0:2}.log" 2>&1
  status=$?
  echo "$name: exit $status, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
  [ "$status" -eq 0 ] || failed=1
done
exit $failed
