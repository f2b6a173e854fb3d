"""NVIDIA's C++ perf_analyzer as a second load generator, its results shaped like ``streamrt perf --json``.

``scripts/setup_perf_analyzer.sh`` puts it at ``build/perf_analyzer/perf_analyzer``. :func:`run` starts
it against ``127.0.0.1:port``, reads the CSV it writes (``-f``) and returns one dict per concurrency
level with the keys of ``streamrt perf --json``'s levels, so a benchmark can measure a server with
either client and treat both results alike::

    binary = perf_analyzer_client.find()
    levels, status, tail, command = perf_analyzer_client.run(binary, "grpc", 8001, "null_small", 1, "16", 4.0)

What perf_analyzer does that callers should know (2.43.0):

* A level it cannot stabilise ("Failed to obtain stable measurement within 10 measurement windows")
  is dropped, and in a linear sweep the sweep stops there; when that was the only level it exits 2
  and writes no CSV. :func:`run` then reruns once with ``--stability-percentage 100`` (from the first
  lost level on; the whole search with ``--binary-search``) and marks the levels of that rerun
  ``"unstable": True``.
* With ``--latency-threshold`` a level over the bound is dropped from the CSV too (the stdout says
  "Measured latency went over the set limit"), so every returned level of a bounded run is within it.
  Its ``--binary-search`` counts a level it cannot stabilise as over the bound: on an H100 serving
  ResNet-50 (2026-12-07, 2 s windows) all three transports' searches over 1:64:1 ended at concurrency 1
  while ``streamrt perf``'s search found 10-24. :func:`search` is the bounded search to use: the
  search of ``streamrt perf --latency-bound-ms`` (:func:`streamrt.client.search.search_bound`), each
  level one perf_analyzer run (stabilised, or rerun loosely and marked).
* The CSV's rows come sorted by throughput; :func:`parse_csv` sorts them by concurrency.
* Its ``Request count`` (requests in the reported windows) is only in the stdout; :func:`run` adds it
  to each level as ``requests``.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["find", "parse_csv", "parse_request_counts", "run", "search"]

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BINARY = ROOT / "build" / "perf_analyzer" / "perf_analyzer"
UNSTABLE = "Failed to obtain stable measurement"
TAIL_CHARS = 4000

# CSV column -> key in the level's dict; the CSV's times are microseconds
_SERVER_COLUMNS = {"Server Queue": "queue", "Server Compute Input": "compute_input",
                   "Server Compute Infer": "compute_infer", "Server Compute Output": "compute_output"}
_CLIENT_COLUMNS = {"Client Send": "send", "Network+Server Send/Recv": "network_server", "Client Recv": "recv"}
_LATENCY_COLUMNS = {"p50 latency": "median", "p90 latency": "p90", "p95 latency": "p95", "p99 latency": "p99"}


def find(explicit: str | None = None) -> Path | None:
    """The perf_analyzer to run: ``explicit``, else ``$STREAMRT_PERF_ANALYZER``, else
    ``<repo>/build/perf_analyzer/perf_analyzer``; None when the first of these that is given is not
    an executable file (a named binary that is missing is not silently replaced by another)."""
    named = explicit or os.environ.get("STREAMRT_PERF_ANALYZER")
    path = Path(named) if named else DEFAULT_BINARY
    return path if path.is_file() and os.access(path, os.X_OK) else None


def parse_csv(text: str) -> list[dict[str, Any]]:
    """The levels of a perf_analyzer ``-f`` CSV (``--percentile`` given, so pNN columns), by concurrency.

    ``latency_ms["avg"]`` (also ``"mean"``, the key ``streamrt perf`` uses) is the sum of the CSV's
    latency components, perf_analyzer's average request time; it writes no average column when a
    percentile is asked for.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = [name.strip() for name in lines[0].split(",")]
    levels = []
    for line in lines[1:]:
        row = dict(zip(header, (value.strip() for value in line.split(",")), strict=False))
        if "Concurrency" not in row:
            continue
        server = {key: _number(row, column) for column, key in _SERVER_COLUMNS.items()}
        client = {key: _number(row, column) for column, key in _CLIENT_COLUMNS.items()}
        latency = {key: _number(row, column) / 1e3 for column, key in _LATENCY_COLUMNS.items()}
        latency["avg"] = latency["mean"] = (sum(server.values()) + sum(client.values())) / 1e3
        levels.append({"concurrency": int(row["Concurrency"]), "throughput": float(row["Inferences/Second"]),
                       "latency_ms": latency, "server_us": server, "client_us": client, "errors": 0,
                       "client": "perf_analyzer"})
    return sorted(levels, key=lambda level: level["concurrency"])


def _number(row: dict[str, str], column: str) -> float:
    return float(row.get(column) or "nan")


def parse_request_counts(output: str) -> dict[int, int]:
    """Concurrency -> ``Request count`` of the windows perf_analyzer reported for it (its stdout)."""
    counts = {}
    for block in re.split(r"^Request concurrency: ", output, flags=re.MULTILINE)[1:]:
        level, _, rest = block.partition("\n")
        found = re.search(r"^\s+Request count: (\d+)", rest, flags=re.MULTILINE)
        if level.strip().isdigit() and found:
            counts[int(level)] = int(found.group(1))
    return counts


def run(binary: Path, protocol: str, port: int, model: str, batch: int, concurrency_range: str, seconds: float,
        shared_memory: str = "none", output_shared_memory_size: int = 0, latency_bound_ms: float | None = None,
        extra: Sequence[str] = (), timeout: float = 600) -> tuple[list[dict[str, Any]], int, str, str]:
    """perf_analyzer as a child against ``127.0.0.1:port``: (levels, exit status, output tail, the command).

    ``concurrency_range`` is perf_analyzer's ``START[:END[:STEP]]``; ``seconds`` its measurement window.
    With ``latency_bound_ms`` the search is ``--latency-threshold X --binary-search`` (on p99) and each
    level gets ``latency_bound`` = ``{"bound_ms", "within", "best"}``, ``best`` on the one
    highest-throughput level within the bound. A non-zero exit is returned, not raised: the levels are
    what was measured (an exit of 124 when ``timeout`` seconds passed). The output tail keeps
    perf_analyzer's failure lines; the command is the first run's (a stability rerun is named in the tail).

    Raises:
        FileNotFoundError: ``binary`` is not a file.
    """
    if not Path(binary).is_file():
        raise FileNotFoundError(f"no perf_analyzer at {binary}: run scripts/setup_perf_analyzer.sh "
                                "(or set STREAMRT_PERF_ANALYZER)")
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as work:
        csv = Path(work) / "levels.csv"

        def command(levels: str, stability: Sequence[str] = ()) -> list[str]:
            return [str(binary), "-m", model, "-u", f"127.0.0.1:{port}", "-i", protocol, "-b", str(batch),
                    "--concurrency-range", levels, "--measurement-mode", "time_windows",
                    "--measurement-interval", str(int(seconds * 1000)), "--percentile", "99", "-f", str(csv),
                    *(["--shared-memory", shared_memory] if shared_memory != "none" else []),
                    *(["--output-shared-memory-size", str(output_shared_memory_size)]
                      if shared_memory != "none" and output_shared_memory_size > 0 else []),
                    *(["--latency-threshold", f"{latency_bound_ms:g}", "--binary-search"]
                      if latency_bound_ms is not None else []),
                    *stability, *extra]

        first = command(concurrency_range)
        levels, status, output = _run_once(first, csv, deadline)
        tail = _tail(output)
        if UNSTABLE in output and status != 124:
            rerun_range = (concurrency_range if latency_bound_ms is not None
                           else _rest_of_range(concurrency_range, {level["concurrency"] for level in levels}))
            rerun = command(rerun_range, ["--stability-percentage", "100"])
            more, status, output = _run_once(rerun, csv, deadline)
            measured = {level["concurrency"] for level in levels}
            levels = sorted([*levels, *({**level, "unstable": True} for level in more
                                        if level["concurrency"] not in measured)],
                            key=lambda level: level["concurrency"])
            tail = f"{tail}\n--- rerun: {shlex.join(rerun)}\n{_tail(output)}"
    for level in levels:
        level.setdefault("unstable", False)
    if latency_bound_ms is not None:
        _mark_bound(levels, latency_bound_ms)
    return levels, status, tail, shlex.join(first)


def search(binary: Path, protocol: str, port: int, model: str, batch: int, concurrency_range: str, seconds: float,
           latency_bound_ms: float, shared_memory: str = "none", extra: Sequence[str] = (),
           timeout: float = 600) -> tuple[list[dict[str, Any]], int, str, list[str]]:
    """The highest throughput whose p99 stays within ``latency_bound_ms``: ``streamrt perf --latency-bound-ms``'s
    search (doubling from START, then bisecting to STEP of ``concurrency_range`` ``START:END[:STEP]``), every level
    measured by one perf_analyzer run at that concurrency.

    Returns (levels in the order tried, each with ``latency_bound`` = ``{"ms", "percentile", "under", "best"}``;
    the last non-zero exit status, 124 when ``timeout`` ran out; the output tails; each level's command). A level
    perf_analyzer could not measure at all counts as over the bound (no requests), as in ``streamrt perf``.
    """
    from streamrt.client.loadgen import LevelResult
    from streamrt.client.search import LatencyBound, search_bound
    from streamrt.measure.stats import Stats

    parts = [int(p) for p in concurrency_range.split(":")]
    start, end, step = parts[0], parts[1] if len(parts) > 1 else parts[0], parts[2] if len(parts) > 2 else 1
    bound = LatencyBound(bound_ms=latency_bound_ms, percentile=99, start=start, end=end, step=step)
    deadline = time.monotonic() + timeout
    measured: dict[int, dict[str, Any]] = {}
    tails: list[str] = []
    commands: list[str] = []
    worst = 0

    async def measure(concurrency: int) -> LevelResult:
        nonlocal worst
        left = deadline - time.monotonic()
        levels, status, tail, command = ([], 124, "(no time left)", "") if left <= 1 else await asyncio.to_thread(
            run, binary, protocol, port, model, batch, str(concurrency), seconds, shared_memory=shared_memory,
            extra=extra, timeout=left)
        worst = status or worst
        tails.append(f"--- concurrency {concurrency} (exit {status}):\n{tail[-600:]}")
        commands.append(command)
        level = next((lv for lv in levels if lv["concurrency"] == concurrency), None)
        if level is None:
            return LevelResult(concurrency, 0, 1, 0.0, None, first_error=tail.strip()[-300:])
        measured[concurrency] = level
        lat, nan = level["latency_ms"], math.nan
        stats = Stats(count=level.get("requests", 0), min=nan, max=nan, mean=lat["avg"], median=lat["median"],
                      p90=lat["p90"], p95=lat["p95"], p99=lat["p99"], std=nan, cov=nan)
        return LevelResult(concurrency, max(level.get("requests", 0), 1), 0, level["throughput"], stats,
                           server_us=dict(level["server_us"]),
                           warning="perf_analyzer: no stable measurement" if level.get("unstable") else "")

    found = asyncio.run(search_bound(bound, measure))
    levels = []
    for result, verdict in zip(found.levels, found.to_json(), strict=True):
        level = dict(measured.get(result.concurrency) or {"concurrency": result.concurrency, "throughput": 0.0,
                                                          "latency_ms": {}, "server_us": {}, "errors": 1,
                                                          "client": "perf_analyzer"})
        level["latency_bound"] = verdict["latency_bound"]
        if result.warning:
            level["warning"] = result.warning
        levels.append(level)
    return levels, worst, "\n".join(tails), commands


def _run_once(cmd: list[str], csv: Path, deadline: float) -> tuple[list[dict[str, Any]], int, str]:
    csv.unlink(missing_ok=True)
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=max(deadline - time.monotonic(), 1.0))
        status, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as exc:
        raw = exc.stdout or ""
        status, output = 124, (raw.decode(errors="replace") if isinstance(raw, bytes) else raw)
        output += f"\n(perf_analyzer killed after the {exc.timeout:.0f} s left of the timeout)"
    levels = parse_csv(csv.read_text()) if csv.is_file() else []
    counts = parse_request_counts(output)
    for level in levels:
        level["requests"] = counts.get(level["concurrency"], 0)
    return levels, status, output


def _rest_of_range(concurrency_range: str, measured: set[int]) -> str:
    """``START:END:STEP`` from the first level of ``concurrency_range`` not in ``measured`` (a linear
    sweep stops at the level it could not stabilise); the whole range when none is missing."""
    parts = [int(p) for p in concurrency_range.split(":")]
    start, end, step = parts[0], parts[1] if len(parts) > 1 else parts[0], parts[2] if len(parts) > 2 else 1
    missing = [c for c in range(start, end + 1, step) if c not in measured]
    if not missing:
        return concurrency_range
    return f"{missing[0]}:{end}:{step}" if missing[0] != end else str(end)


def _mark_bound(levels: list[dict[str, Any]], bound_ms: float) -> None:
    within = [level for level in levels if level["latency_ms"]["p99"] <= bound_ms]
    best = max(within, key=lambda level: level["throughput"], default=None)
    for level in levels:
        level["latency_bound"] = {"bound_ms": bound_ms, "within": level["latency_ms"]["p99"] <= bound_ms,
                                  "best": level is best}


def _tail(output: str) -> str:
    """The last ``TAIL_CHARS`` of ``output``, after any failure line that falls before them (a level lost
    mid-sweep says so in the middle of the output)."""
    end = output[-TAIL_CHARS:]
    head = output[:-TAIL_CHARS] if len(output) > TAIL_CHARS else ""
    failures = [line for line in head.splitlines() if line.startswith(("Failed", "error", "Error"))]
    return "\n".join([*failures, *(["..."] if head else []), end]).strip()
