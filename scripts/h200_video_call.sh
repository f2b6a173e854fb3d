#!/usr/bin/env bash
# One H200 call for issue 27 (video detection with NVDEC at scale), each step under its own timeout
# (60 + 90 + 250 + 130 = 530 s by default), each step's log under $OUT/<step>/log as it goes, everything packed
# into $OUT/h200.tar.gz at the end (no clips, videos or files over 4 MB).
#
#   bash scripts/h200_video_call.sh COMMIT              # on the device machine (wheels in .whl-video/,
#                                                       # clips in build/video-clips from make_video_clips.py)
#   DRY_RUN=1 bash scripts/h200_video_call.sh COMMIT    # print the commands only (CPU check)
#   STEPS=tests,video VIDEO_ARGS="--streams 150,175 --parts 2" bash scripts/h200_video_call.sh COMMIT
#                                                       # some steps only, other check arguments
#   SAVE_CACHE=1 ...   # also return the build cache ($STREAMRT_CACHE: the detector's plan) as
#                      # $OUT/srtcache.tgz, to carry into the next call (STREAMRT_CACHE=build/srtcache)
#
# The device copy has no git history: COMMIT names the tree for the reports.
set -uo pipefail
commit=${1:?commit}
out=${OUT:-/tmp/out}
clips=${CLIPS:-build/video-clips}
dry=${DRY_RUN:-}
steps=",${STEPS:-tests,reruns,video,videotests},"
video_args=${VIDEO_ARGS:---streams 100,150,200 --baselines-at 100 --baselines before --parts 2 --budget 240}
cache=${STREAMRT_CACHE:-/tmp/srtcache}
mkdir -p "$out"
if [ -z "$dry" ]; then
    if compgen -G ".whl-video/*.whl" > /dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl-video/*.whl > "$out/pip.log" 2>&1 || { cat "$out/pip.log"; exit 1; }
    else  # the speed and profile steps need none; the NVDEC ones then skip their tests
        echo "no .whl-video/ carried: PyNvVideoCodec not installed"
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
    grep -m1 "model name" /proc/cpuinfo || true
    if [ -f build/srtcache.tgz ] && [ ! -d "$cache" ]; then  # a build cache returned by an earlier call
        mkdir -p "$(dirname "$cache")" && tar -xzf build/srtcache.tgz -C "$(dirname "$cache")" \
            && echo "build cache restored from build/srtcache.tgz into $cache"
    fi
fi
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1 STREAMRT_CACHE=$cache \
    STREAMRT_COMMIT=$commit STREAMRT_VIDEO_CLIPS=$clips
# every step imports streamrt: stop at once, in one line, when a core dependency did not travel (on 2026-12-04 a
# call without .whl-video/ ran every step into the same ModuleNotFoundError: cattrs is not on the image)
if [ -z "$dry" ] && ! python3 -c "import streamrt" 2> "$out/import.log"; then
    echo "streamrt does not import here: $(tail -n 1 "$out/import.log"); carry .whl-video/ (cattrs and attrs at least)"
    exit 2
fi

run() {  # run STEP TIMEOUT CMD...: log to $out/STEP/log (appended), print the tail; a step not in STEPS is skipped
    local name=$1 limit=$2; shift 2
    case $steps in *",$name,"*) ;; *) return 0 ;; esac
    mkdir -p "$out/$name"
    if [ -n "$dry" ]; then echo "[$name, timeout $limit s] $*"; return 0; fi
    local t0=$SECONDS
    echo "\$ $*" >> "$out/$name/log"
    timeout "$limit" "$@" >> "$out/$name/log" 2>&1
    local rc=$?
    echo "== $name rc=$rc in $((SECONDS - t0)) s (limit $limit s)"
    tail -n 25 "$out/$name/log"
}

# 1. the pool hand-over test (NVDEC in processes and take_ready against the in-process pool), 60 s
run tests 60 python3 -m pytest -v -p no:cacheprovider tests/video/test_decode_processes.py -k nvdec_in_processes
# 2. the GPU tests that failed in the full suite of 2026-12-02 (d7c454e), alone, 90 s
run reruns 90 python3 -m pytest -v -p no:cacheprovider -m gpu --timeout 80 tests/device/test_pinnable.py \
    tests/serve/test_memory_budget.py tests/serve/test_batch_property.py
# 3. decode-included camera-paced sweep, 4 decoder processes, admission; the old reader beside the new at 100 (250 s)
# shellcheck disable=SC2086  # VIDEO_ARGS is a list of arguments
run video "${VIDEO_TIMEOUT:-250}" python3 scripts/gpu_video_check.py "$out/video" --clips "$clips" \
    --decode-processes 4 --admission queue $video_args
# 3b. (not by default) NVDEC sessions open at once in one process (primary context, kept decoders): 220 opened one
#     at a time, device memory per session, a few frames from each in order (issue 27: 200 opened on 2026-12-02), ~60 s
# shellcheck disable=SC2086  # NVDEC_ARGS is a list of arguments
run nvdec "${NVDEC_TIMEOUT:-150}" python3 scripts/gpu_nvdec_scaling.py "$out/nvdec" --clips "$clips" \
    ${NVDEC_ARGS:---variants= --open-variants primary+reuse --open 220 --budget 140}
# 4. every gpu-marked video test, as far as 130 s go
# shellcheck disable=SC2086  # VIDEOTESTS_ARGS is a list of arguments
run videotests "${VIDEOTESTS_TIMEOUT:-130}" python3 -m pytest -v -p no:cacheprovider -m gpu --timeout 120 \
    ${VIDEOTESTS_ARGS:-tests/video}
# 4b. (not by default) the product path at scale: `streamrt detect` over DETECT_STREAMS camera-paced streams (the
#     clips cycled), NVDEC in 4 decoder processes and CPU decoder processes for the rest (--hybrid), admission from
#     both sides measured at once; the per-stream table and the report under $out/detectcli
detect_streams=${DETECT_STREAMS:-185}
mapfile -t found < <(compgen -G "$clips/*.mp4" | sort)
[ ${#found[@]} -gt 0 ] || found=("$clips/clip0.mp4")  # (the dry run, without clips)
streams=()
for ((i = 0; i < detect_streams; i++)); do streams+=("${found[i % ${#found[@]}]}"); done
#     DETECT_PROFILE=threads,gil: the CLI once per mode under py-spy (its wheel carried in .whl-video/), the consumer
#     process sampled 100 times a second without pausing it, as folded stacks in $out/detectcli/py-spy-MODE.txt:
#     threads = every thread, waits included (what each does between engine calls), gil = only the thread holding
#     the GIL (who keeps the others waiting). Without it: one run, unprofiled.
spy=$(command -v py-spy || echo /tmp/site/bin/py-spy)
profiles=${DETECT_PROFILE:-none}
for mode in ${profiles//,/ }; do
    profiler=()
    report="$out/detectcli/report"
    case $mode in
        none) ;;
        threads | gil)
            if [ -z "$dry" ] && [ ! -x "$spy" ]; then
                echo "DETECT_PROFILE: no py-spy here (carry its wheel in .whl-video/); the CLI runs unprofiled"
            else
                sampled=--idle
                [ "$mode" = gil ] && sampled=--gil
                profiler=("$spy" record --threads "$sampled" --nonblocking --nolineno --rate 100 --format raw
                          --output "$out/detectcli/py-spy-$mode.txt" --)
                report="$out/detectcli/report-$mode"
            fi ;;
        *) echo "DETECT_PROFILE takes threads and/or gil, not $mode"; continue ;;
    esac
    # shellcheck disable=SC2086  # DETECT_ARGS is a list of arguments
    run detectcli "${DETECTCLI_TIMEOUT:-200}" "${profiler[@]}" python3 -m streamrt detect "${streams[@]}" \
        ${DETECT_ARGS:---decode-processes 4 --hybrid --paced --no-progress} --report "$report"
done
# 5. (not by default) the AOTInductor runner without the GIL on the GPU: its backend tests and the detector's
run runners "${RUNNERS_TIMEOUT:-150}" python3 -m pytest -v -p no:cacheprovider -m gpu --timeout 140 \
    tests/backends/test_torch_inductor_gpu.py -k "nogil or replay or steady or fresh" tests/video/test_gpu_detection.py
# 6. (not by default) engine speed (benchmarks/engine_speed.py with SPEED_ARGS), e.g. level 5 and its warm rebuild
#    SPEED_PROFILE=1: the benchmark and every process it starts (the builds' compile children) under py-spy, 50
#    samples a second, waits included, as folded stacks in $out/speed/py-spy.txt (where a build's time goes)
speed_profiler=()
if [ -n "${SPEED_PROFILE:-}" ]; then
    if [ -z "$dry" ] && [ ! -x "$spy" ]; then
        echo "SPEED_PROFILE: no py-spy here (carry its wheel in .whl-video/); the benchmark runs unprofiled"
    else
        speed_profiler=("$spy" record --subprocesses --threads --idle --nonblocking --nolineno --rate 50 --format raw
                        --output "$out/speed/py-spy.txt" --)
    fi
fi
# shellcheck disable=SC2086  # SPEED_ARGS is a list of arguments
run speed "${SPEED_TIMEOUT:-300}" "${speed_profiler[@]}" python3 benchmarks/engine_speed.py --out "$out/speed" \
    ${SPEED_ARGS:---groups resnet50@32=L5,L5r --lanes 1 --budget 280 --build-budget-s 200 --deadlines L5=230,L5r=60}
[ -f "$out/speed/py-spy.txt" ] && gzip -f "$out/speed/py-spy.txt"  # the pack drops files over 4 MB
# 6b. (not by default) what differs between the generated Triton template sources in a timing cache the speed step
#     shared (SPEED_ARGS with --timing-cache SOURCES_DIR): why a rebuild's template candidates miss the cache
run sources 60 python3 scripts/inductor_source_diff.py "${SOURCES_DIR:-/tmp/tc}" --examples 2
#     and (SOURCES_PROBE=1) what Inductor's CPU vector-ISA probe costs a fresh process (AOTInductor's compile calls
#     it; it builds and loads test programs unless the cache has them), twice: 42 and 47 s on the H100 of 2026-12-07
if [ -n "${SOURCES_PROBE:-}" ]; then
    for probe in 1 2; do
        run sources 90 env TORCHINDUCTOR_CACHE_DIR="${SOURCES_DIR:-/tmp/tc}" python3 scripts/vec_isa_probe.py
    done
fi
# 6c. (not by default) the engine process's CPU per request behind N front ends, on this host's CPU (no GPU used):
#     benchmarks/engine_request_path.py (issue 26: the H200 host's engine process spent 81-100 us per 64 B request
#     against 33-52 on the CI machine; which host, which cause), ~15 s per case and round
# shellcheck disable=SC2086  # ENGINEPATH_ARGS is a list of arguments
run enginepath "${ENGINEPATH_TIMEOUT:-120}" python3 benchmarks/engine_request_path.py --out "$out/enginepath/table.md" \
    ${ENGINEPATH_ARGS:---cases small:1 --concurrency 8 --drivers 8 --seconds 5 --rounds 2 --spinning both}
# 7. (not by default) the kernel tables of plans the speed step kept (SPEED_ARGS with --keep-scratch): time per
#    kernel kind, for issue 28's "what separates the plans from the roofline". PROFILE_PLANS: the plans' tags
#    (MODEL-PRECISION-bBATCH-VARIANT), each profiled in turn into the same log, under PROFILE_TIMEOUT each
for tag in ${PROFILE_PLANS:-resnet50-fp16-b32-L5}; do
    # shellcheck disable=SC2086  # PROFILE_ARGS is a list of arguments
    run profile "${PROFILE_TIMEOUT:-90}" python3 -m streamrt profile "$out/speed/scratch/$tag.plan" \
        ${PROFILE_ARGS:---iterations 20 --top 40}
    # the generated wrapper C++ (which FX nodes and ATen ops each kernel launch came from), a few seconds
    run profile 30 python3 scripts/plan_sources.py "$out/speed/scratch/$tag.plan" --out "$out/profile/sources"
done
[ -n "$dry" ] && exit 0
bash "$(dirname "$0")/h200_pack.sh" "$out"
if [ -n "${SAVE_CACHE:-}" ] && [ -d "$cache" ]; then  # files back are at most 16 MiB each
    tar -czf /tmp/srtcache.tgz -C "$(dirname "$cache")" "$(basename "$cache")" \
        && [ "$(stat -c %s /tmp/srtcache.tgz)" -lt 15000000 ] && mv /tmp/srtcache.tgz "$out/" \
        || echo "build cache not returned: $(du -sh "$cache")"
    ls -la "$out"
fi
