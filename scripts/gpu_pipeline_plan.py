"""Build the pipeline benchmark's bundled CNN into a torch_inductor plan (fp16, static 1x3xSxS).

Usage: python scripts/gpu_pipeline_plan.py OUT.plan [--size 640]
Then: python scripts/gpu_pipeline_check.py OUTDIR --plan OUT.plan
"""

from __future__ import annotations

import argparse

import torch

from streamrt.building.module_builder import build_module
from streamrt.config import BuildConfig
from streamrt.testing.workloads import FrameSpec, tiny_cnn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("output")
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--precision", default="fp16")
    args = parser.parse_args()
    spec = FrameSpec(size=args.size)
    config = BuildConfig(backend="torch_inductor", precision=args.precision, backend_options={"device": "cuda"})
    example = torch.randn(1, 3, spec.size, spec.size)
    build_module(tiny_cnn(spec), [example], args.output, config, input_names=["images"], output_names=["logits"])


if __name__ == "__main__":
    main()
