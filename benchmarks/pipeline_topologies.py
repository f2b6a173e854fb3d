"""Benchmark: one frame workload through the pipeline topologies, side by side in one run.

(a) the synchronous loop, (b) one stream per stage, (c) replicated single-stream workers and
(b+c) replicated stage-per-stream workers, each with and without CUDA graphs on a GPU. Frames are
1080p uint8 from pageable host memory; pre-processing, the engine and top-k post-processing run
on the device; results come back to the host. Rounds are interleaved and the median is reported.

Usage (same options as ``streamrt pipeline-bench``)::

    python benchmarks/pipeline_topologies.py --device cuda --out docs/benchmarks/pipeline-h200
    python benchmarks/pipeline_topologies.py --device cpu --torch-threads 1 --out docs/benchmarks/pipeline-cpu
"""

from __future__ import annotations

import sys

from streamrt.cli.pipeline_bench import main

if __name__ == "__main__":
    sys.exit(main())
