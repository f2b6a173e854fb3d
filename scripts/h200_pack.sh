#!/usr/bin/env bash
# Pack a device call's results: only reports come back (files back are at most 16 MiB each), so plans,
# models, videos and arrays are deleted, files over 4 MB dropped (and listed), and $1 becomes one tarball.
#
#   bash scripts/h200_pack.sh "$OUT"      # the last step of h200_session.sh and h200_video_call.sh
set -uo pipefail
out=${1:?out}
# build scratch (benchmarks' --keep-scratch: Inductor caches of thousands of small files, 53 MB packed on
# 2026-12-03, over the limit, so nothing came back) is for the call itself, not for the reports
find "$out" -type d -name scratch -prune -exec rm -rf {} +
find "$out" -type f \( -name '*.plan' -o -name '*.onnx' -o -name '*.pt2' -o -name '*.mp4' -o -name '*.npz' \
    -o -name '*.npy' -o -name '*.avi' -o -name '*.h264' \) -delete
find "$out" -type f -size +4M -printf 'dropped (over 4 MB): %p %s\n' -delete
tar -czf /tmp/h200.tar.gz -C "$out" .
limit=${PACK_LIMIT_BYTES:-15000000}  # what comes back is at most 16 MiB a file
if [ "$(stat -c %s /tmp/h200.tar.gz)" -gt "$limit" ]; then  # still too big: the text reports alone
    echo "h200.tar.gz over $limit bytes: packing only the reports (*.md, *.json, *.jsonl, *.txt, log)"
    (cd "$out" && find . -type f \( -name '*.md' -o -name '*.json' -o -name '*.jsonl' -o -name '*.txt' -o -name log \) \
        -print0 | tar -czf /tmp/h200.tar.gz --null -T -)
fi
mv /tmp/h200.tar.gz "$out/h200.tar.gz"
find "$out" -mindepth 1 -maxdepth 1 ! -name h200.tar.gz -exec rm -rf {} +
ls -la "$out"
