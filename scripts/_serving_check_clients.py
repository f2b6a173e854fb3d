"""``scripts/gpu_serving_check.py``'s load generators: ``streamrt perf`` and NVIDIA's perf_analyzer behind one
interface, so every row of parts (a), (b) and (c) can be measured by either (``--clients``).

The scripts folder is not a package: the check imports this with ``scripts/`` on ``sys.path``. The benchmarks'
modules (``serving_frontend`` for ``streamrt perf``, ``perf_analyzer_client``) are loaded from their files.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def benchmark(name: str) -> Any:
    """``benchmarks/<name>.py`` as a module (the benchmarks folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sf = benchmark("serving_frontend")


def perf_analyzer(args: argparse.Namespace) -> tuple[Any, Path]:
    """NVIDIA's perf_analyzer (``--clients perf_analyzer``): its runner module and binary, or SystemExit naming how
    to get it (a row of each transport fails with that line; the other client's rows stand)."""
    module = benchmark("perf_analyzer_client")
    binary = module.find(args.perf_analyzer)
    if binary is None:
        raise SystemExit("perf_analyzer not found: run scripts/setup_perf_analyzer.sh, or pass --perf-analyzer PATH")
    return module, binary


def shared_memory(extra: list[str]) -> str:
    """A transport's ``--shared-memory`` kind (``none`` for binary tensors in the request)."""
    return extra[extra.index("--shared-memory") + 1] if "--shared-memory" in extra else "none"


def measure(client: str, protocol: str, port: int, model: str, batch: int, args: argparse.Namespace,
            extra: list[str]) -> dict[str, Any]:
    """One level at ``--concurrency`` by ``client``: ``streamrt perf --json``'s level (perf_analyzer's in that
    shape, its unsettled measurement as a ``warning``)."""
    if client == "perf_analyzer":
        module, binary = perf_analyzer(args)
        levels, status, tail, command = module.run(binary, protocol, port, model, batch, str(args.concurrency),
                                                   args.seconds, shared_memory=shared_memory(extra),
                                                   timeout=args.seconds * 30 + 120)
        if not levels:
            raise SystemExit(f"perf_analyzer failed ({status}): {tail.strip()[-1500:]}")
        result = dict(levels[0], command=command)
        result.setdefault("errors", 0)
        if result.get("unstable"):
            result["warning"] = "perf_analyzer: no stable measurement; the last window's figures"
        return result
    options = [*(["--warmup-ms", "200"] if args.quick else []), *extra]
    return dict(sf.run_perf(protocol, port, model, batch, args.concurrency, args.processes, args.seconds, options))


def bound_levels(client: str, port: int, model: str, args: argparse.Namespace,
                 extra: list[str]) -> tuple[list[dict[str, Any]], int, str]:
    """Part (c)'s search over gRPC by ``client``: (every level tried, exit status, output tail); the best level
    within ``--latency-bound-ms`` has ``latency_bound.best``. Both clients search alike (``streamrt perf``'s
    doubling, then bisecting); perf_analyzer measures each level in a run of its own, as its own
    ``--binary-search`` counts an unsettled level as over the bound (on an H100 on 2026-12-07 it ended at
    concurrency 1 on every transport)."""
    if client == "perf_analyzer":
        module, binary = perf_analyzer(args)
        levels, status, tail, _ = module.search(binary, "grpc", port, model, args.request_batch, args.bound_range,
                                                args.bound_seconds, args.latency_bound_ms,
                                                shared_memory=shared_memory(extra), extra=("--max-trials", "6"),
                                                timeout=16 * (args.bound_seconds * 12 + 10) + 60)
        return levels, status, tail
    options = [*(["--warmup-ms", "200"] if args.quick else []), "--latency-bound-ms", f"{args.latency_bound_ms:g}",
               *extra]
    levels, status, stderr, _ = sf.run_perf_levels(
        "grpc", port, model, args.request_batch, args.bound_range, args.processes, args.bound_seconds,
        options, timeout=24 * (args.bound_seconds + 40) + 120)
    return levels, status, stderr
