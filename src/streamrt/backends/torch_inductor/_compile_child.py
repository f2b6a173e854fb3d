"""The child process of a budgeted compile: ``python -m streamrt.backends.torch_inductor._compile_child JOB.json``.

Loads the exported program the build saved and compiles it with each of the job's stages' Inductor
configs in turn (TF32 and cuDNN benchmark flags as the build has them; ``TORCHINDUCTOR_CACHE_DIR``
inherited, so the timing cache is the build's and a later stage finds what an earlier one timed).
Each stage's ``.pt2`` is written whole (a temporary file renamed) as soon as it is compiled, and a
line ``streamrt-stage-done INDEX SECONDS`` says so: the parent keeps the last whole package when
it kills the child at its deadline (:mod:`.budget`). A line ``streamrt-timing-miss WHY`` says what each
timing-cache miss lacked as it happens, and ``streamrt-compile-phases ...`` after each stage where the compile spent
its time (torch's own compile timers, inclusive: a phase's time holds the phases inside it); at the end it
writes the timing-cache hits and misses it counted.
It exits when its parent dies, so a build killed from outside leaves no compile running.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

PHASES_SHOWN = 10


def compile_phases(shown: int = PHASES_SHOWN) -> str:
    """torch's compile timers so far (``torch._dynamo.utils.compile_times``, summed per phase), the longest first:
    ``"compile_file 24.3 s, aoti_precompile_header 13.4 s, ..."``. Never raises: a diagnosis, not a step."""
    try:
        from torch._dynamo.utils import compile_times

        names, seconds = compile_times(repr="csv", aggregate=True)
        ranked = sorted(zip(names, (float(str(s)) for s in seconds), strict=True), key=lambda p: -p[1])
        return ", ".join(f"{name} {s:.1f} s" for name, s in ranked[:shown]) or "none recorded"
    except Exception as exc:  # torch's internals moved
        return f"not recorded ({type(exc).__name__}: {exc})"


def main(job_path: str) -> int:
    """Run the job in ``job_path``; 0 when the package was written."""
    import torch

    from streamrt.backends.torch_inductor.budget import MISSED, PHASES, STAGE_DONE
    from streamrt.backends.torch_inductor.builder import compile_package, torch_warnings_logged
    from streamrt.backends.torch_inductor.cache import TimingCacheStats, count_autotuning
    from streamrt.backends.torch_inductor.deadline import watch_parent
    from streamrt.backends.torch_inductor.tf32 import backend_flags
    from streamrt.plan import atomic_write

    job = json.loads(Path(job_path).read_text())
    with watch_parent():
        ep = torch.export.load(job["program"])
        stats = TimingCacheStats("child")
        def missed(why: str) -> None:  # as it happens: a child killed at its deadline writes no stats
            print(f"{MISSED} {why}", flush=True)

        with count_autotuning(stats, missed), backend_flags(bool(job["tf32"]), bool(job["cudnn_benchmark"])), \
                torch.inference_mode(False), torch.no_grad(), torch_warnings_logged():
            for index, stage in enumerate(job["stages"]):
                started = time.monotonic()
                package = compile_package(ep, stage["configs"])
                with atomic_write(Path(stage["out"])) as f:
                    f.write(package)
                print(f"{PHASES} {compile_phases()}", flush=True)
                print(f"{STAGE_DONE} {index} {time.monotonic() - started:.0f}", flush=True)
        Path(job["stats"]).write_text(json.dumps({"hits": stats.hits, "misses": stats.misses}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
