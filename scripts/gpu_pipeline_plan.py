"""Build the pipeline benchmark's bundled CNN into a torch_inductor plan (fp16, static 1x3xSxS).

Usage: python scripts/gpu_pipeline_plan.py OUT.plan [--size 640]
Then: python scripts/gpu_pipeline_check.py OUTDIR --plan OUT.plan

``--device cpu --size 32`` is the smoke run (fp32, seconds of Inductor's CPU code generation).
"""

from __future__ import annotations

import argparse
import sys

import torch

from streamrt.building.module_builder import build_module
from streamrt.config import BuildConfig
from streamrt.testing.workloads import FrameSpec, tiny_cnn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("output")
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp16")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    spec = FrameSpec(size=args.size)
    config = BuildConfig(backend="torch_inductor", precision=args.precision, backend_options={"device": args.device})
    example = torch.randn(1, 3, spec.size, spec.size)
    built = build_module(tiny_cnn(spec), [example], args.output, config, input_names=["images"],
                         output_names=["logits"])
    print(f"{built.path}: {built.manifest.backend} {args.precision}, input 1x3x{spec.size}x{spec.size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
