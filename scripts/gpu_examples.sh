#!/usr/bin/env bash
# Run every example of examples/ with --device cuda; outputs and one log per example under OUT_DIR.
#   bash scripts/gpu_examples.sh OUT_DIR
# Writes OUT_DIR/NN/ (each example's figures), OUT_DIR/NN.log and OUT_DIR/summary.txt
# (example, exit status, seconds). Record the results in docs/examples-h200.md.
set -uo pipefail
out=${1:?usage: bash scripts/gpu_examples.sh OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg PYTHONUNBUFFERED=1
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible to torch')" || exit 2
{
  echo "commit: ${STREAMRT_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  python3 -c "import torch; print('device:', torch.cuda.get_device_name(), '| torch', torch.__version__)"
} > "$out/summary.txt"
failed=0
for script in "$root"/examples/[0-9][0-9]_*.py; do
  name=$(basename "$script" .py)
  start=$(date +%s)
  python3 "$script" --device cuda --out "$out/${name:0:2}" > "$out/${name:0:2}.log" 2>&1
  status=$?
  echo "$name: exit $status, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
  [ "$status" -eq 0 ] || failed=1
done
exit $failed
