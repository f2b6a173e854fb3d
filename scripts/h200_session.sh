#!/usr/bin/env bash
# One call on the H200 device machine: install the carried wheels, then run the named parts,
# each writing its log and results under $OUT/<part>/, and pack everything into $OUT/h200.tar.gz.
#
#   bash scripts/h200_session.sh COMMIT tests,examples      # first call (~6 min)
#   bash scripts/h200_session.sh COMMIT zoo                 # second call (~8 min)
#   bash scripts/h200_session.sh COMMIT tests+examples      # both at once (untimed work only)
#   DRY_RUN=1 bash scripts/h200_session.sh COMMIT zoo,speed  # print the commands only (the CPU check in CI)
#
# Parts: tests (every gpu-marked test; TESTS=paths, TEST_WORKERS=N for pytest-xdist), examples (examples/ with --device cuda), zoo
# (benchmarks/zoo.py), integrity (the batch-integrity property test on GPU instances, also in tests),
# serving (SERVING_ARGS, e.g. "--grpc-server h2corn --frontend-processes 1,4,8"; serving2: a second run with SERVING2_ARGS), video, sharing (benchmarks/gpu_sharing.py), detens (benchmarks/detection_ensemble.py),
# staging (benchmarks/staging_copies.py on CUDA: a large batch's gather and host-to-device copy, one copy vs pieces on
# STAGING_THREADS threads), speed (benchmarks/engine_speed.py with SPEED_ARGS), trust (scripts/gpu_trust_check.py: the batched-cameras and
# two-stage GPU tests explained), balance (benchmarks/frontend_balance.py: gRPC connections over 8 front ends, and
# what more connections change for 4.8 MB requests on this host's cores; no GPU used; BALANCE_ARGS), nvexamples (NVIDIA's
# Triton client examples against streamrt serve, scripts/nvidia_client_examples.py; the four CUDA shared-memory ones
# need this GPU: copies of upstream's scripts in NVIDIA_EXAMPLES, default .carry/nvidia-examples, carried).
# The device copy has no git history: COMMIT names the tree for the reports.
set -uo pipefail
commit=${1:?commit}
parts=${2:-tests}
out=${OUT:-/tmp/out}
dry=${DRY_RUN:-}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1 STREAMRT_CACHE=/tmp/srtcache STREAMRT_COMMIT=$commit
if [ -z "$dry" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        > "$out/pip.log" 2>&1 || { cat "$out/pip.log"; exit 1; }
    # every part imports streamrt: stop in one line when a core dependency did not travel
    python3 -c "import streamrt" 2> "$out/import.log" \
        || { echo "streamrt does not import here: $(tail -n 1 "$out/import.log"); carry .whl/ (cattrs, attrs)"; exit 2; }
    python3 -c "import onnxruntime, torch; print('onnxruntime', onnxruntime.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())"
    nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv,noheader
    grep -m1 "model name" /proc/cpuinfo || true
fi

run() {  # run NAME TIMEOUT CMD...: log to $out/NAME/log, print the tail
    local name=$1 limit=$2; shift 2
    if [ -n "$dry" ]; then echo "[$name, timeout $limit s] $*"; return 0; fi
    mkdir -p "$out/$name"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$out/$name/log" 2>&1
    local rc=$?
    echo "== $name rc=$rc in $((SECONDS - t0)) s"
    tail -n 25 "$out/$name/log"
}

part() {  # part NAME: one part of the session
    case $1 in
        tests) run tests "${TESTS_LIMIT:-360}" python3 -m pytest -v -p no:cacheprovider -m gpu ${TESTS:-tests} \
                   ${TEST_WORKERS:+-n $TEST_WORKERS --dist ${TEST_DIST:-loadfile}} --timeout "${TEST_TIMEOUT:-600}" \
                   -o junit_family=xunit2 --junitxml="$out/tests/junit.xml" ;;
        integrity) run integrity 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/serve -k integrity ;;
        examples) run examples "${EXAMPLES_LIMIT:-300}" bash scripts/gpu_examples.sh "$out/examples" ${EXAMPLES:-} ;;
        nvexamples) run nvexamples 180 python3 scripts/nvidia_client_examples.py \
                        --examples "${NVIDIA_EXAMPLES:-.carry/nvidia-examples}" --markdown "$out/nvexamples/table.md" ;;
        zoo) run zoo 540 python3 benchmarks/zoo.py "$out/zoo" --device cuda --workers "${ZOO_WORKERS:-4}" \
                 --models "${ZOO_MODELS:-resnet18,mobilenet_v3_large,efficientnet_b0,vit_tiny_patch16_224,zoo:mtcnn,zoo:yolo}" ;;
        serving) run serving 540 python3 scripts/gpu_serving_check.py "$out/serving" ${SERVING_ARGS:-} ;;
        serving2) local plans=()  # the plans the first serving part built, when it ran
                  [ -d "$out/serving/plans" ] && plans=(--plans "$out/serving/plans")
                  run serving2 540 python3 scripts/gpu_serving_check.py "$out/serving2" "${plans[@]}" ${SERVING2_ARGS:-} ;;
        video) run video 540 python3 scripts/gpu_video_check.py "$out/video" --clips build/video-clips --budget 450 ;;
        trust) run trust "${TRUST_LIMIT:-540}" python3 scripts/gpu_trust_check.py "$out/trust" --budget "${TRUST_BUDGET:-520}" ;;
        sharing) run sharing 300 python3 benchmarks/gpu_sharing.py "$out/sharing" --cache-dir /tmp/srtcache ;;
        detens) run detens 240 python3 benchmarks/detection_ensemble.py "$out/detens" --seconds "${DETENS_SECONDS:-10}" ;;
        staging) run staging 120 python3 benchmarks/staging_copies.py --device cuda --threads "${STAGING_THREADS:-0,1,2,4,8}" \
                     --out "$out/staging/staging-copies.md" ;;
        speed) run speed "${SPEED_LIMIT:-540}" python3 benchmarks/engine_speed.py --out "$out/speed" ${SPEED_ARGS:-} ;;
        balance) run balance 240 python3 benchmarks/frontend_balance.py --out "$out/balance/frontend-balance.md" \
                     ${BALANCE_ARGS:---frontend-processes 8 --processes 8 --concurrency 64 --shares 0,6 --rounds 3 --case image:8} ;;
        *) echo "unknown part $1" ;;
    esac
}

# Parts run one after the other; "a+b" runs a and b at the same time (untimed work only:
# tests and examples build and check, they time nothing that is reported).
IFS=, read -ra wanted <<< "$parts"
for group in "${wanted[@]}"; do
    IFS=+ read -ra together <<< "$group"
    for name in "${together[@]}"; do part "$name" & done
    wait
done
[ -n "$dry" ] && exit 0
rm -rf "$out"/zoo/plans
bash "$(dirname "$0")/h200_pack.sh" "$out"
