"""The child process of a budgeted compile: ``python -m streamrt.backends.torch_inductor._compile_child JOB.json``.

Loads the exported program the build saved, compiles it with the job's Inductor configs (TF32 and
cuDNN benchmark flags as the build has them; ``TORCHINDUCTOR_CACHE_DIR`` inherited, so the timing
cache is the build's), writes the ``.pt2`` and the timing-cache hits and misses it counted. It
exits when its parent dies, so a build killed from outside leaves no compile running.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(job_path: str) -> int:
    """Run the job in ``job_path``; 0 when the package was written."""
    import torch

    from streamrt.backends.torch_inductor.builder import compile_package, torch_warnings_logged
    from streamrt.backends.torch_inductor.cache import TimingCacheStats, count_autotuning
    from streamrt.backends.torch_inductor.deadline import watch_parent
    from streamrt.backends.torch_inductor.tf32 import backend_flags

    job = json.loads(Path(job_path).read_text())
    with watch_parent():
        ep = torch.export.load(job["program"])
        stats = TimingCacheStats("child")
        with count_autotuning(stats), backend_flags(bool(job["tf32"]), bool(job["cudnn_benchmark"])), \
                torch.inference_mode(False), torch.no_grad(), torch_warnings_logged():
            package = compile_package(ep, job["configs"])
        Path(job["out"]).write_bytes(package)
        Path(job["stats"]).write_text(json.dumps({"hits": stats.hits, "misses": stats.misses}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
