"""benchmarks/gpu_sharing.py in its CPU mode (ONNX Runtime, tiny models): it runs end to end against the
real server and writes a table with a row per model and scenario."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("load", [[], ["--protocol", "http", "--client-processes", "2", "--frontend-processes", "2"]],
                         ids=["grpc-default", "http-2-clients-2-frontends"])
def test_gpu_sharing_benchmark_cpu_mode_writes_a_row_per_model(tmp_path: Path, load: list[str]) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_sharing.py"), str(out), "--device", "cpu", "--seconds", "2",
         "--warmup", "0.5", "--concurrency", "2", "--cache-dir", str(tmp_path / "cache"), *load],
        capture_output=True, text=True, timeout=280, env=env, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (out / "gpu-sharing-cpu.md").read_text()
    rows = [line.split("|")[1:-1] for line in report.splitlines() if line.startswith("| ") and "---" not in line]
    header, body = [c.strip() for c in rows[0]], [[c.strip() for c in r] for r in rows[1:]]
    assert header == ["scenario", "model", "input", "priority", "infer/s", "images/s", "p50 ms", "p99 ms", "errors",
                      "avg batch", "client busy %", "GPU util %", "saturated"]
    seen = {(r[0], r[1]) for r in body}
    assert seen == {(s, m) for s in ("no priorities", "priorities") for m in ("large", "medium", "small")}
    for row in body:
        assert float(row[4]) == float(row[5]) > 0 and float(row[7]) >= float(row[6]) > 0 and row[8] == "0", row
        assert float(row[9]) >= 1.0 and 0 <= float(row[10]) <= 100 and row[11:] == ["-", "-"], row  # no NVML here
    # the verdict is spelled out, and the start-up is broken down into the server's model loads
    assert report.count("GPU saturated? unknown (no NVML reading): not a measurement of a saturated GPU") == 2
    loads = [line for line in report.splitlines() if "server ready" in line]
    assert len(loads) == 2 and all(f"{m} " in line for m in ("large", "medium", "small") for line in loads), loads
    assert {r[1]: r[3] for r in body if r[0] == "priorities"} == {"large": "4", "medium": "1", "small": "2"}
    transport = "HTTP binary tensors" if load else "gRPC"
    processes = 2 if load else 1
    assert f"({processes} client process(es) per model, {transport}, 1 images per request)" in report
    assert f"- serving: {processes} front-end process(es)" in report


def test_the_saturation_verdict_says_front_end_bound_below_the_threshold() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_sharing", ROOT / "benchmarks" / "gpu_sharing.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.modules[spec.name]
    assert bench.verdict(93.4, 80.0) == "yes: GPU util 93 % >= 80 %"
    assert bench.verdict(4.6, 80.0).startswith("NO: GPU util 5 % < 80 %: the figures are front-end-bound")
    assert bench.verdict(None, 80.0).startswith("unknown")
