"""Run on the GPU machine: the pipeline-topology benchmark with and without CUDA graphs.

Writes ``pipeline_bench.md`` (table, analysis, stage times, environment), ``pipeline_bench.json``,
Chrome traces (``traces/``) and PNG timelines (``timelines/``) into OUT_DIR, and prints the table.
The gpu-marked tests are run separately with pytest.

Usage::

    python scripts/gpu_pipeline_check.py OUT_DIR [extra pipeline-bench options, e.g. --items 1000]
"""

from __future__ import annotations

import argparse
import sys

from streamrt.cli.pipeline_bench import main as bench_main


def _facts(device: str) -> None:
    import torch

    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device "
          f"{torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}")
    print(f"torch.cuda.Stream has __cuda_stream__: {hasattr(torch.cuda.Stream, '__cuda_stream__')}")
    if device == "cuda":
        free, total = torch.cuda.mem_get_info()
        print(f"GPU memory free {free / 2**30:.1f} GiB of {total / 2**30:.1f} GiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="where the report, traces and timelines go")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the smoke run (tests/pipeline/test_gpu_pipeline_scripts.py), with tiny options")
    args, extra = parser.parse_known_args(argv)
    try:
        import torch
    except ImportError:
        print("torch is not installed", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: this script is for the GPU machine (--device cpu is its smoke run)", file=sys.stderr)
        return 2
    _facts(args.device)
    return bench_main(["--device", args.device, "--compare-graphs", "-o", args.out_dir, *extra])


if __name__ == "__main__":
    sys.exit(main())
