"""``streamrt perf --latency-bound-ms``: the search's path on a fake load (which levels, which best), then the
real server with a model whose latency is known: four Python instances that each sleep 100 ms per request,
so p99 stays near 100 ms up to concurrency 4 and nears 200 ms past it (a request waits for a busy
instance). The search must find concurrency 4 (3 to 5 on a busy machine) at up to 40 infer/s, and say
so in the table, the summary line, the JSON and the CSV; a bound below 100 ms is met by no level."""

from __future__ import annotations

import asyncio
import csv
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamrt.cli.main import main
from streamrt.cli.perf import parse_search_range
from streamrt.client.loadgen import LevelResult
from streamrt.client.search import LatencyBound, search_bound
from streamrt.errors import ConfigError
from streamrt.measure.stats import Stats
from streamrt.serve import ServerConfig, ServerThread

pytestmark = pytest.mark.timeout(180)

SLEEP_MS = 100
BOUND_MS = 160
INSTANCES = 4
SLEEPY_CONFIG = f"""
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: {INSTANCES} kind: KIND_CPU }} ]
"""
SLEEPY_MODEL = f"""
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({SLEEP_MS / 1e3})  # one request per execute (no dynamic batching): {SLEEP_MS} ms each
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                 .as_numpy())]) for r in requests]
"""
FAST = ["--measurement-interval", "2000", "--warmup-ms", "300"]


def _fake(instances: int, service_ms: float, errors_from: int = 10**6) -> tuple[list[int], object]:
    """A closed-loop queue: ``instances`` servers of ``service_ms`` each; latency grows once they are busy."""
    tried: list[int] = []

    async def measure(concurrency: int) -> LevelResult:
        tried.append(concurrency)
        waits = 1.5 if concurrency > instances and concurrency % instances else 1.0  # an uneven share waits more
        latency = service_ms * math.ceil(concurrency / instances) * waits
        throughput = min(concurrency, instances) * 1e3 / service_ms
        return LevelResult(concurrency, requests=100, errors=int(concurrency >= errors_from), throughput=throughput,
                           latency_ms=Stats.from_samples([latency * 0.9] * 98 + [latency] * 2))

    return tried, measure


def _search(bound: LatencyBound, measure: object) -> object:
    return asyncio.run(search_bound(bound, measure))  # type: ignore[arg-type]


def test_doubles_then_bisects_to_the_last_level_under_the_bound() -> None:
    tried, measure = _fake(instances=4, service_ms=40)
    found = _search(LatencyBound(60), measure)
    assert tried == [1, 2, 4, 8, 6, 5]  # 8 is over: bisect 4..8
    assert found.best.concurrency == 4 and found.marks() == ["under", "under", "best", "over", "over", "over"]
    assert found.summary() == "best under 60 ms p99: 100.0 infer/s at concurrency 4 (p99 40.00 ms)"


def test_the_step_stops_the_bisection_and_the_end_stops_the_doubling() -> None:
    tried, measure = _fake(instances=24, service_ms=10)
    found = _search(LatencyBound(12, start=2, end=100, step=4), measure)
    assert tried == [2, 4, 8, 16, 32, 24, 28]  # 16..32 -> 24 under, 28 over, then 24..28 is within the step
    assert found.best.concurrency == 24 and not found.reached_end
    tried, measure = _fake(instances=1000, service_ms=10)
    found = _search(LatencyBound(12, end=20), measure)
    assert tried == [1, 2, 4, 8, 16, 20] and found.best.concurrency == 20 and found.reached_end


def test_errors_are_over_the_bound_and_no_level_under_says_so() -> None:
    tried, measure = _fake(instances=4, service_ms=40, errors_from=4)
    assert _search(LatencyBound(60), measure).best.concurrency == 3
    tried, measure = _fake(instances=4, service_ms=40)
    found = _search(LatencyBound(30, percentile=50), measure)
    assert tried == [1] and found.best is None
    assert found.summary() == "no concurrency level meets p50 <= 30 ms: concurrency 1 had p50 36.00 ms"


def test_ranges_and_settings_are_checked() -> None:
    assert parse_search_range("1") == (1, 1024, 1) and parse_search_range("8:64:4") == (8, 64, 4)
    for bad in ("1,2,4", "8:4", "0", "a"):
        with pytest.raises(ConfigError):
            parse_search_range(bad)
    for kwargs in ({"bound_ms": 0}, {"bound_ms": 5, "percentile": 42}, {"bound_ms": 5, "step": 0}):
        with pytest.raises(ConfigError):
            LatencyBound(**kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def sleepy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("sleepy")
    (root / "sleepy" / "1").mkdir(parents=True)
    (root / "sleepy" / "config.pbtxt").write_text(SLEEPY_CONFIG)
    (root / "sleepy" / "1" / "model.py").write_text(SLEEPY_MODEL)
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5)
    with ServerThread(root, config, start_timeout=60) as running:
        yield running


def test_the_search_finds_where_the_server_saturates(sleepy: ServerThread, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Up to 4 clients, every request runs at once (p99 near 100 ms); from 5 on, requests wait for an
    instance (p99 near 200 ms). With a 50 ms sleep the busy 2-core CI machine measured p99 72 ms at 4 and
    100 ms at 5, so the bound of 160 ms leaves room for its stalls; one may still push concurrency 4 over
    it (then 3 is the answer) or let 5 slip under it, never more."""
    url = f"127.0.0.1:{sleepy.grpc_port}"
    out = tmp_path / "bound.csv"
    argv = ["perf", "-m", "sleepy", "-u", url, "-i", "grpc", "--latency-bound-ms", f"{BOUND_MS}", *FAST,
            "-o", str(out)]
    assert main([*argv, "--json"]) == 0
    levels = json.loads(capsys.readouterr().out)
    tried = [level["concurrency"] for level in levels]
    (best,) = [level for level in levels if level["latency_bound"]["best"]]
    assert tried[:3] == [1, 2, 4] and best["concurrency"] in (3, 4, 5), levels
    assert tried[3:] in ([8, 6, 5], [3]), tried  # 4 under: bisect 4..8; 4 over: bisect 2..4
    highest = max(level["concurrency"] for level in levels if level["latency_bound"]["under"])
    assert all(level["latency_bound"]["under"] == (level["concurrency"] <= highest) for level in levels), levels
    # About min(C, 4) requests per 100 ms: 4 instances x 10 requests/s at most, a little less for the protocol.
    ceiling = min(best["concurrency"], INSTANCES) * 1e3 / SLEEP_MS
    assert 0.7 * ceiling <= best["throughput"] <= 1.03 * ceiling, best
    assert SLEEP_MS <= best["latency_ms"]["p99"] <= BOUND_MS
    assert all(level["latency_ms"]["p99"] > BOUND_MS for level in levels if level["concurrency"] >= 8)
    with open(out) as f:
        rows = list(csv.DictReader(f))
    marks = {str(level["concurrency"]): "best" if level["latency_bound"]["best"] else
             "under" if level["latency_bound"]["under"] else "over" for level in levels}
    assert {r["Concurrency"]: r["Latency Bound"] for r in rows} == marks


def _row(line: str) -> tuple[str, str]:
    """A table row's concurrency and search verdict."""
    cells = line.split()
    return cells[0], cells[-1]


def test_text_report_and_a_bound_no_level_meets(sleepy: ServerThread, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"127.0.0.1:{sleepy.http_port}"
    argv = ["perf", "-m", "sleepy", "-u", url, "--concurrency-range", "2:4", *FAST]
    assert main([*argv, "--latency-bound-ms", "400"]) == 0  # far above: both levels are under it
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "bound" and [_row(line) for line in lines[2:4]] == [("2", "under"), ("4", "best")]
    assert lines[-2].startswith("best under 400 ms p99: ") and " infer/s at concurrency 4 (p99 " in lines[-2], lines
    assert lines[-1].startswith("note: concurrency 4, the range's end, was still under the bound"), lines
    assert main([*argv, "--latency-bound-ms", "50", "--percentile", "50"]) == 2
    captured = capsys.readouterr()
    assert _row(captured.out.splitlines()[2]) == ("2", "over")  # the table of what was tried is still printed
    error = captured.err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(
        "streamrt perf: error: no concurrency level meets p50 <= 50 ms: concurrency 2 had p50 "), error
