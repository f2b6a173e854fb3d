#!/usr/bin/env bash
# Sets up .venv and runs the main job: generate a ResNet-18-shaped model, build a plan with a
# dynamic-batch profile, benchmark it trtexec-style, and inspect it. Outputs land in out/.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
mkdir -p out
.venv/bin/python -m streamrt.testing.models resnet18 out/resnet18.onnx
.venv/bin/streamrt build out/resnet18.onnx -o out/resnet18.plan \
    --min-shapes images:1x3x224x224 --opt-shapes images:4x3x224x224 --max-shapes images:16x3x224x224
.venv/bin/streamrt bench out/resnet18.plan --batch 4 --duration 5
.venv/bin/streamrt inspect out/resnet18.plan
