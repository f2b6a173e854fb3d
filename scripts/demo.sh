#!/usr/bin/env bash
# Sets up .venv and runs the main job, `streamrt demo`: build (or reuse) a plan of the bundled
# detector with the best backend here, run a generated clip through the synchronous loop and
# through the multi-stream pipeline, print both throughputs and the speed-up, and write the
# annotated video, detections (JSON Lines) and timelines to out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[video,plot]'
.venv/bin/streamrt demo -o out/demo "$@"
