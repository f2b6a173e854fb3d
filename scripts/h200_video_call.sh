#!/usr/bin/env bash
# One H200 call for issue 27 (video detection with NVDEC at scale), each step under its own timeout
# (180 + 100 + 60 + 230 = 570 s), each step's log under $OUT/<step>/log as it goes, everything packed
# into $OUT/h200.tar.gz at the end (no clips, videos or files over 4 MB).
#
#   bash scripts/h200_video_call.sh COMMIT              # on the device machine (wheels in .whl-video/,
#                                                       # clips in build/video-clips from make_video_clips.py)
#   DRY_RUN=1 bash scripts/h200_video_call.sh COMMIT    # print the commands only (CPU check)
#
# The device copy has no git history: COMMIT names the tree for the reports.
set -uo pipefail
commit=${1:?commit}
out=${OUT:-/tmp/out}
clips=${CLIPS:-build/video-clips}
dry=${DRY_RUN:-}
mkdir -p "$out"
if [ -z "$dry" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl-video/*.whl > "$out/pip.log" 2>&1 || { cat "$out/pip.log"; exit 1; }
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
fi
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1 STREAMRT_CACHE=/tmp/srtcache \
    STREAMRT_COMMIT=$commit STREAMRT_VIDEO_CLIPS=$clips

run() {  # run STEP TIMEOUT CMD...: log to $out/STEP/log (appended), print the tail
    local name=$1 limit=$2; shift 2
    mkdir -p "$out/$name"
    if [ -n "$dry" ]; then echo "[$name, timeout $limit s] $*"; return 0; fi
    local t0=$SECONDS
    echo "\$ $*" >> "$out/$name/log"
    timeout "$limit" "$@" >> "$out/$name/log" 2>&1
    local rc=$?
    echo "== $name rc=$rc in $((SECONDS - t0)) s (limit $limit s)"
    tail -n 25 "$out/$name/log"
}

# 1. tests (180 s): the decoder-process test first, then every gpu-marked video test
run tests 30 python3 -m pytest -v -p no:cacheprovider tests/video/test_decode_processes.py -k nvdec_in_processes
run tests 150 python3 -m pytest -v -p no:cacheprovider -m gpu tests/video --timeout 140
# 2. NVDEC scaling (100 s): 4 processes, counted in the workers vs handed over by CUDA IPC
run nvdec 100 python3 scripts/gpu_nvdec_scaling.py "$out/nvdec" --clips "$clips" --sessions 14,28,56 \
    --variants primary+reuse+p4,primary+reuse+ipc4 --open-variants "" --budget 90
# 3. open test (60 s): 200 sessions at once, device memory per session (cudaMemGetInfo before/after each)
run open 60 python3 scripts/gpu_nvdec_scaling.py "$out/open" --clips "$clips" --variants "" \
    --open-variants primary+reuse --open 200 --budget 52
# 4. video check (230 s): decode-included camera-paced sweep with 4 decoder processes and admission,
#    GPU vs CPU decode vs raw, hybrid
run video 230 python3 scripts/gpu_video_check.py "$out/video" --clips "$clips" --decode-processes 4 \
    --streams 100,150,200 --admission queue --parts 2,3,5 --budget 215
[ -n "$dry" ] && exit 0
bash "$(dirname "$0")/h200_pack.sh" "$out"
