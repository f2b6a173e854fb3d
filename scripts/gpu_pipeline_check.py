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


def _facts() -> None:
    import torch

    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device {torch.cuda.get_device_name()}")
    print(f"torch.cuda.Stream has __cuda_stream__: {hasattr(torch.cuda.Stream, '__cuda_stream__')}")
    free, total = torch.cuda.mem_get_info()
    print(f"GPU memory free {free / 2**30:.1f} GiB of {total / 2**30:.1f} GiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="where the report, traces and timelines go")
    args, extra = parser.parse_known_args(argv)
    try:
        import torch
    except ImportError:
        print("torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("no CUDA GPU: this script is for the GPU machine", file=sys.stderr)
        return 2
    _facts()
    return bench_main(["--device", "cuda", "--compare-graphs", "-o", args.out_dir, *extra])


if __name__ == "__main__":
    sys.exit(main())
