"""What a rebuild pays per process, measured in three fresh processes on one small model (a few minutes at most).

Issue 28's rebuild with new weights (ResNet-50, level 5, H100, 2026-12-06): the compile child spent 33.7 of its 55 s
in AotCodeCompiler.compile, of which torch's timers named only 5 s; the same compile's second stage in the first
build's child took 5 s in all. So ~29 s is paid once per process: Inductor's CPU vector-ISA probe (untimed, cached
per process; 42-48 s in a fresh process on the H100 of 2026-12-07). Since a1b293e a cache directory records which of
the probe's test builds passed and later compile processes answer them from it. This check builds a three-layer MLP
into one ``--timing-cache``:

1. ``first``: the first build (records the probe's answer);
2. ``rebuild``: new weights, a fresh process: the record used;
3. ``rebuild-probing``: new weights again, a fresh process, with ``STREAMRT_VEC_ISA_RECORD=0`` (the probe runs).

Each row: build seconds, the timing cache's hits and misses with what each miss lacked, and the compile phases. The
difference between rows 2 and 3 is what the record saves per compile process. Then the generated template sources
of the cache are compared (``scripts/inductor_source_diff.py``): why a rebuild's GEMM candidates miss the cache.

Usage::

    python scripts/gpu_rebuild_check.py OUT [--level 5] [--device cuda] [--budget 120]
    python scripts/gpu_rebuild_check.py OUT --level 3 --device cpu     # the CPU smoke run (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS: tuple[tuple[str, int, dict[str, str]], ...] = (
    ("first", 0, {}), ("rebuild", 1, {}), ("rebuild-probing", 2, {"STREAMRT_VEC_ISA_RECORD": "0"}))


def build_once(out: Path, cache: Path, seed: int, level: int, device: str, budget: float) -> dict[str, object]:
    """In this process: the MLP with weights from ``seed``, built at ``level`` into ``cache``; a row."""
    import torch

    from streamrt.building.module_builder import build_module
    from streamrt.config import BuildConfig

    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 64)).eval()
    lines: list[str] = []
    config = BuildConfig(backend="torch_inductor", precision="fp16" if device == "cuda" else "fp32",  # type: ignore[arg-type]
                         optimization_level=level, keep_io_types=False, timing_cache=cache,
                         build_budget_s=budget if level >= 4 else None, backend_options={"device": device})
    started = time.perf_counter()
    built = build_module(net, [torch.randn(64, 256)], out / f"mlp-{seed}.plan", config, input_names=["x"],
                         output_names=["y"], progress=lines.append, cache_dir=out / f"cache-{seed}")
    seconds = time.perf_counter() - started
    timing = (built.manifest.build_settings.get("backend") or {}).get("timing_cache") or {}
    return {"build_s": round(seconds, 1), "hits": timing.get("hits"), "misses": timing.get("misses"),
            "package": timing.get("package"),
            "missed": [line.split("timing cache miss: ", 1)[1] for line in lines if "timing cache miss: " in line],
            "phases": [line.split("compile phases: ", 1)[1] for line in lines if "compile phases: " in line]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--level", type=int, default=5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget", type=float, default=120.0, help="build budget of a level-4/5 build (s)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds each build's process may take")
    p.add_argument("--rows", default=",".join(name for name, _, _ in ROWS),
                   help="which rows, in order (first,rebuild: the record's and the timing aliases' effect without the "
                        "probing row's 45 s)")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child: build seed ONE, print a row
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.out / "timing-cache"
    if args.one is not None:
        print("ROW " + json.dumps(build_once(args.out, cache, args.one, args.level, args.device, args.budget)))
        return 0
    report = args.out / "rebuild-check.jsonl"
    rows = []
    wanted = [name.strip() for name in args.rows.split(",") if name.strip()]
    unknown = set(wanted) - {name for name, _, _ in ROWS}
    if unknown:
        p.error(f"--rows: no row {', '.join(sorted(unknown))} (rows: {', '.join(name for name, _, _ in ROWS)})")
    for name, seed, env in (row for row in ROWS if row[0] in wanted):  # each in a fresh process: what a rebuild
        # pays per process is the point
        command = [sys.executable, str(Path(__file__).resolve()), str(args.out), "--one", str(seed), "--level",
                   str(args.level), "--device", args.device, "--budget", str(args.budget)]
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT,
                                  env={**os.environ, **env})
            found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
            row = json.loads(found[-1]) if done.returncode == 0 and found else {
                "error": f"exit {done.returncode}: {(done.stdout + done.stderr)[-600:]}"}
        except subprocess.TimeoutExpired:
            row = {"error": f"did not finish in {args.timeout:.0f} s"}
        row = {"row": name, "process_s": round(time.perf_counter() - started, 1), **row}
        rows.append(row)
        with report.open("a") as f:  # as it comes: a call cut short keeps the rows before
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    done = subprocess.run([sys.executable, str(ROOT / "scripts/inductor_source_diff.py"), str(cache), "--examples",
                           "2"], capture_output=True, text=True, timeout=120)
    (args.out / "template-diff.txt").write_text(done.stdout + done.stderr)
    print(done.stdout[-3000:])
    ok = [r for r in rows if "error" not in r]
    if len(ok) == len(rows) == len(ROWS):
        saved = float(ok[2]["process_s"]) - float(ok[1]["process_s"])
        print(f"the vector-ISA record saved {saved:.1f} s of a rebuild's process (rebuild {ok[1]['process_s']} s, "
              f"probing {ok[2]['process_s']} s)")
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
