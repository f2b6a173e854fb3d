"""CPU smoke runs of the benchmarks that had none: each runs end to end in seconds with tiny settings,
exits 0 and writes its table with the expected rows, so a renamed API breaks here, not in a GPU call.

The other benchmarks have their own: engine_speed (+ speed_variants) in test_engine_speed_benchmark.py,
gpu_sharing and detection_ensemble in tests/serve/, detection through scripts/gpu_detection_check.py
(tests/video/test_gpu_detection_check.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, script: str, *args: str) -> str:
    env = {**os.environ, "STREAMRT_CACHE": str(tmp_path / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=280, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
            if line.startswith("| ") and "---" not in line]


def test_engine_request_path_writes_a_row_per_case(tmp_path: Path) -> None:
    out = tmp_path / "erp.md"
    _run(tmp_path, "engine_request_path.py", "--cases", "small:1", "--concurrency", "2", "--drivers", "1",
         "--seconds", "1", "--warmup", "0.3", "--instances", "1", "--rounds", "1", "--spinning", "both",
         "--out", str(out))
    rows = _rows(out.read_text())
    assert rows[0][:4] == ["request", "source", "round", "requests/s"]
    assert [r[:3] for r in rows[1:]] == [["small x1", "this tree", "1"], ["small x1", "this tree, spinning off", "1"]]
    assert all(float(r[3].replace(",", "")) > 0 and r[-1] == "0" for r in rows[1:]), rows


def test_engine_request_path_cases_keep_the_callers_pythonpath(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    # A GPU host installs the wheels with pip --target and puts that folder on PYTHONPATH: a case child that
    # replaced PYTHONPATH with its source tree lost cattrs there (H100, 2026-12-07, the enginepath step).
    import importlib.util

    spec = importlib.util.spec_from_file_location("engine_request_path", ROOT / "benchmarks" / "engine_request_path.py")
    assert spec is not None and spec.loader is not None
    erp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(erp)
    site, other = tmp_path / "site", tmp_path / "other" / "src"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(ROOT / "src")]))
    assert erp._pythonpath(ROOT / "src").split(os.pathsep) == [str(ROOT / "src"), str(site)]
    assert erp._pythonpath(other).split(os.pathsep) == [str(other), str(site)]


@pytest.mark.slow
def test_serving_frontend_writes_a_row_per_protocol(tmp_path: Path) -> None:
    out = tmp_path / "sf.md"
    _run(tmp_path, "serving_frontend.py", "--cases", "grpc:small:1,http:small:1", "--concurrency", "2",
         "--seconds", "1", "--instances", "1", "--out", str(out))
    rows = _rows(out.read_text())
    assert [r[:3] for r in rows[1:]] == [["grpc", "null_small x1", "64"], ["http", "null_small x1", "64"]]
    assert all(float(r[3].replace(",", "")) > 0 and r[-1] == "0" for r in rows[1:]), rows


def test_malloc_thresholds_compares_both_variants_per_case(tmp_path: Path) -> None:
    out = tmp_path / "malloc.md"
    _run(tmp_path, "malloc_thresholds.py", "--cases", "grpc:image:8@1,grpc:small:1@2", "--rounds", "1",
         "--seconds", "0.5", "--out", str(out))
    rows = _rows(out.read_text())
    assert [r[1] for r in rows[1:]] == ["glibc defaults", "serving (mallopt)"] * 2, rows
    assert all(float(r[2].replace(",", "")) > 0 and r[-1] == "0" for r in rows[1:]), rows
    assert rows[2][3].endswith("x") and rows[1][3] == "", rows


def test_frontend_balance_counts_each_front_ends_connections(tmp_path: Path) -> None:
    """Two front ends, two client processes: every run's spread names both workers and adds up to the
    connections perf opened (one per process at concurrency 2 each, whatever the share)."""
    pytest.importorskip("h2corn")
    out = tmp_path / "fb.md"
    _run(tmp_path, "frontend_balance.py", "--quick", "--out", str(out))
    rows = _rows(out.read_text())
    assert rows[0][:4] == ["round", "--grpc-channel-share", "connections", "spread"]
    assert [r[:3] for r in rows[1:]] == [["1", "0", "2"], ["1", "6", "2"]], rows
    for r in rows[1:]:
        spread = [int(n) for n in r[3].split()]
        assert len(spread) == 2 and sum(spread) == 2 and r[-1] == "0", rows
        assert float(r[4].replace(",", "")) > 0


def test_http_library_floor_writes_a_row_per_round(tmp_path: Path) -> None:
    """The aiohttp variant only: granian is not a dependency (the benchmark shows why)."""
    out = tmp_path / "floor.md"
    _run(tmp_path, "http_library_floor.py", "--variants", "aiohttp", "--concurrency", "2", "--processes", "1",
         "--seconds", "1", "--rounds", "1", "--out", str(out))
    rows = _rows(out.read_text())
    assert rows[0][:3] == ["library", "round", "requests/s"]
    assert [r[:2] for r in rows[1:]] == [["aiohttp", "1"]]
    assert float(rows[1][2].replace(",", "")) > 0 and float(rows[1][3]) > 0 and rows[1][-1] == "0", rows


def test_grpc_request_path_measures_both_variants(tmp_path: Path) -> None:
    """The in-process gRPC path: every request answered (the script checks each grpc-status), a CPU figure per
    variant. Which variant is cheaper is not asserted: 200 requests are too few to compare."""
    out = tmp_path / "path.md"
    _run(tmp_path, "grpc_request_path.py", "--requests", "200", "--concurrency", "4", "--rounds", "1",
         "--out", str(out))
    rows = _rows(out.read_text())
    assert [r[0] for r in rows[1:]] == ["scheduled", "inline"], rows
    assert all(float(r[1]) > 0 and float(r[2]) >= float(r[1]) * 0.5 for r in rows[1:]), rows


def test_grpc_library_floor_writes_a_row_per_variant_and_round(tmp_path: Path) -> None:
    out = tmp_path / "grpc-floor.md"
    _run(tmp_path, "grpc_library_floor.py", "--concurrency", "2", "--processes", "1", "--seconds", "1",
         "--rounds", "1", "--threads", "2", "--out", str(out))
    rows = _rows(out.read_text())
    assert rows[0][:3] == ["library", "round", "requests/s"]
    assert [r[:2] for r in rows[1:]] == [["grpc-aio", "1"], ["grpc-aio-await", "1"], ["grpc-aio-thread", "1"],
                                         ["grpc-sync", "1"]]
    assert all(float(r[2].replace(",", "")) > 0 and float(r[3]) > 0 and r[-1] == "0" for r in rows[1:]), rows


_ASGI_PACKAGES = ("h2corn", "pyvoy", "connectrpc")


def test_grpc_library_floor_skips_an_asgi_variant_whose_package_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Not installed (as in CI: none is a dependency): the variant is a line naming the pip command, not a crash."""
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import grpc_library_floor

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in _ASGI_PACKAGES else find_spec(name, *a))
    out = tmp_path / "grpc-floor.md"
    monkeypatch.setattr(sys, "argv", ["grpc_library_floor.py", "--variants", "h2corn,pyvoy-1t,h2corn-connect",
                                      "--out", str(out)])
    assert grpc_library_floor.main() == 0
    assert "h2corn            skipped: h2corn not installed: .venv/bin/pip install h2corn" in capsys.readouterr().out
    text = out.read_text()
    assert _rows(text)[1:] == [], text
    assert "- skipped pyvoy-1t: pyvoy not installed: .venv/bin/pip install pyvoy" in text
    assert "- skipped h2corn-connect: h2corn, connectrpc not installed: .venv/bin/pip install h2corn connectrpc" in text


def test_grpc_library_floor_asgi_variants_answer_the_grpcio_client(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ASGI variant whose packages are installed serves the client without errors."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from grpc_asgi_floor import SERVERS

    variants = [name for name, server in SERVERS.items() if server.missing() is None]
    if not variants:
        pytest.skip(f"none of {', '.join(_ASGI_PACKAGES)} is installed (not StreamRT dependencies)")
    out = tmp_path / "grpc-floor.md"
    _run(tmp_path, "grpc_library_floor.py", "--variants", ",".join(variants), "--concurrency", "2",
         "--processes", "1", "--seconds", "1", "--rounds", "1", "--out", str(out))
    rows = _rows(out.read_text())
    assert [r[0] for r in rows[1:]] == sorted(variants)
    assert all(float(r[2].replace(",", "")) > 0 and float(r[3]) > 0 and r[-1] == "0" for r in rows[1:]), rows


def test_server_threads_accounts_each_protocols_cpu_per_request(tmp_path: Path) -> None:
    out = tmp_path / "threads.txt"
    _run(tmp_path, "server_threads.py", "--protocols", "grpc,http", "--seconds", "1", "--concurrency", "2",
         "--processes", "1", "--out", str(out))
    text = out.read_text()
    for protocol in ("grpc", "http"):
        block = text.split(f"{protocol}: ", 1)[1].split("whole process", 1)[0]
        assert "requests/s" in block and "event loop (main thread)" in block, text
    totals = [float(line.split()[2]) for line in text.splitlines() if line.strip().startswith("whole process")]
    assert len(totals) == 2 and all(t > 0 for t in totals), text
    if Path(f"/proc/self/task/{os.getpid()}/schedstat").is_file():
        loops = [line for line in text.splitlines() if "event loop (main thread)" in line]
        shares = [float(line.split("on a CPU")[1].split("%")[0]) for line in loops]
        assert len(shares) == 2 and all(0 < s <= 100 for s in shares) and all("waiting for a CPU" in line
                                                                               for line in loops), text


@pytest.mark.slow
def test_serving_benchmark_without_ray_writes_both_streamrt_rows(tmp_path: Path) -> None:
    out = tmp_path / "serving.md"
    _run(tmp_path, "serving.py", "--concurrency", "2", "--seconds", "1", "--rounds", "1", "--skip-ray",
         "--out", str(out))
    rows = {r[0]: r for r in _rows(out.read_text())[1:]}
    assert {"streamrt (batching)", "streamrt (no batching)"} <= set(rows), rows
    assert all(float(rows[k][1]) > 0 and rows[k][5] == "0"
               for k in ("streamrt (batching)", "streamrt (no batching)")), rows


@pytest.mark.slow
def test_zoo_on_the_cpu_writes_the_reference_and_a_plan_row(tmp_path: Path) -> None:
    _run(tmp_path, "zoo.py", str(tmp_path / "zoo"), "--models", "zoo:mtcnn", "--device", "cpu", "--batch", "2",
         "--workers", "1", "--precisions", "int8")
    rows = {r[2]: r for r in _rows((tmp_path / "zoo" / "zoo.md").read_text()) if r[0] == "zoo:mtcnn"}
    assert set(rows) == {"onnxruntime CPU fp32 (reference)", "onnxruntime int8"}, rows
    assert float(rows["onnxruntime int8"][5].replace(",", "")) > 0 and rows["onnxruntime int8"][-1] in ("pass", "FAIL")
    assert (tmp_path / "zoo" / "zoo.json").is_file()


def test_pipeline_topologies_on_the_cpu_writes_its_report(tmp_path: Path) -> None:
    printed = _run(tmp_path, "pipeline_topologies.py", "--device", "cpu", "--frame-size", "64x36", "--size", "32",
                   "--classes", "10", "--items", "6", "--warmup", "2", "--rounds", "1", "--warmup-rounds", "0",
                   "--trace-items", "0", "--workers", "2", "--distinct-frames", "3", "--verify", "4",
                   "-o", str(tmp_path / "out"))
    assert "| (a) sync |" in printed and "bit-identical in every case" in printed
    assert "| (b+c) streams x2 ring4 |" in (tmp_path / "out" / "pipeline_bench.md").read_text()


def test_gpu_backend_without_a_gpu_records_each_failing_part_and_writes_the_table(tmp_path: Path) -> None:
    """No CPU mode (its timing is CUDA events): here every part fails, each is a row, and the table and JSON
    are still written; before, the first failure (even ``import torchvision``) lost everything."""
    import json

    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the parts would run")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_backend.py"), str(tmp_path / "out"),
                           "onnx:fp32,yolo:fp32,bogus"], cwd=ROOT, capture_output=True, text=True, timeout=280,
                          env=env)
    assert done.returncode == 1, (done.stdout + done.stderr)[-4000:]
    rows = _rows((tmp_path / "out" / "gpu-backend-onnx-yolo-bogus.md").read_text())
    assert [r[0] for r in rows[1:]] == ["onnx", "yolo", "bogus"] and all(r[2].startswith("FAILED (") for r in rows[1:])
    assert "unknown part 'bogus'" in rows[3][2]
    assert len(json.loads((tmp_path / "out" / "gpu-backend-onnx-yolo-bogus.json").read_text())) == 3


def test_grpc_binary_latency_splits_a_request_into_stages_that_add_up(tmp_path: Path) -> None:
    """The stages from the call on add up to the total (timed from the call, as streamrt perf times it)."""
    out = tmp_path / "gbl.md"
    _run(tmp_path, "grpc_binary_latency.py", "--requests", "3", "--concurrency", "1", "--frontends", "1",
         "--out", str(out))
    rows = _rows(out.read_text())
    assert rows[0] == ["configuration", "binary c1", "system shm c1"]
    stages = {r[0]: r[1:] for r in rows}
    assert "parse" in stages and "queue + batching delay" in stages
    total = stages["**total (mean / p99)**"]
    means = [sum(float(v[i].split("/")[0]) for k, v in stages.items()
                 if " / " in v[i] and k not in ("configuration", "stage", "client: request id + body")
                 and not k.startswith(("**", "default")))
             for i in range(2)]
    for i in range(2):
        assert abs(means[i] - float(total[i].strip("*").split("/")[0])) < 0.05 + 0.02 * means[i], (means, total)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_latency_split_joins_perf_requests_with_the_server_trace(tmp_path: Path, protocol: str) -> None:
    """perf --profile-export-file gives each request its own id (the gRPC message and the HTTP JSON header), the
    server's trace records it, and latency_split.py joins the two: every measured request is found, and the three
    parts add up to the client's latency."""
    import json

    import numpy as np
    import onnx

    import streamrt
    from streamrt.serve import ServerConfig, ServerThread
    from streamrt.testing.models import CATALOGUE

    repo = tmp_path / "repo"
    (repo / "cnn" / "1").mkdir(parents=True)
    onnx.save(CATALOGUE["small_cnn"].make(), str(tmp_path / "m.onnx"))
    streamrt.build(tmp_path / "m.onnx", streamrt.BuildConfig(profiles=CATALOGUE["small_cnn"].profiles),
                   repo / "cnn" / "1" / "model.plan", cache_dir=tmp_path / "cache")
    (repo / "cnn" / "config.yaml").write_text("max_batch_size: 8\ndynamic_batching: {}\n")
    trace, requests = tmp_path / "trace.jsonl", tmp_path / "requests.json"
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=None, exit_timeout_s=5, trace_file=str(trace))
    with ServerThread(repo, config) as server:
        port = server.grpc_port if protocol == "grpc" else server.http_port
        done = subprocess.run([sys.executable, "-m", "streamrt.cli.main", "perf", "-m", "cnn", "-i", protocol,
                               "-u", f"127.0.0.1:{port}", "--concurrency-range", "2", "--measurement-interval", "500",
                               "--warmup-ms", "100", "--profile-export-file", str(requests)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
    log = json.loads(requests.read_text())["experiments"][0]["requests"]
    ids = [r["request_id"] for r in log]
    assert log and len(set(ids)) == len(ids)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import latency_split
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    spans = latency_split.server_spans(trace)
    assert set(ids) <= set(spans)  # every measured request was traced under the id perf gave it
    parts = latency_split.split(latency_split.client_requests(requests), spans)
    assert len(parts["total"]) == len(ids)
    np.testing.assert_allclose(parts["inbound"] + parts["server"] + parts["outbound"], parts["total"])
    assert (parts["server"] > 0).all() and (parts["total"] > parts["server"]).all()
    table = subprocess.run([sys.executable, "benchmarks/latency_split.py", "--run", f"s:{requests}:{trace}"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "| s |" in table.stdout and "outbound" in table.stdout, table.stderr


def test_staging_copies_writes_a_row_per_instance_count_and_variant(tmp_path: Path) -> None:
    out = tmp_path / "staging.md"
    _run(tmp_path, "staging_copies.py", "--device", "cpu", "--threads", "0,2", "--instances", "1,2", "--requests",
         "3", "--shape", "2,3,8,8", "--piece-mib", "0.001", "--runs", "3", "--warmup", "1", "--rounds", "1",
         "--out", str(out))
    rows = _rows(out.read_text())
    assert rows[0][:2] == ["instances", "variant"]
    assert [r[:2] for r in rows[1:]] == [[n, v] for n in ("1", "2")
                                         for v in ("one copy", "pieces, 0 threads", "pieces, 2 threads")], rows
    assert all(float(r[5]) > 0 for r in rows[1:]) and rows[1][6] == "1.00", rows
    assert out.with_suffix(".json").is_file()


def test_staging_copies_keeps_the_other_rows_when_a_variant_fails(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("staging_copies", ROOT / "benchmarks" / "staging_copies.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    measured = bench.measure

    def failing(lanes: Any, copier: Any, runs: int, warmup: int, dma_only: bool = False) -> Any:
        if copier is not None and copier.threads == 2:
            raise RuntimeError("a CUDA error, say")
        return measured(lanes, copier, runs, warmup, dma_only)

    monkeypatch.setattr(bench, "measure", failing)
    out = tmp_path / "staging.md"
    status = bench.main(["--device", "cpu", "--threads", "0,2", "--instances", "1", "--requests", "2", "--shape",
                         "2,3,8,8", "--runs", "2", "--warmup", "1", "--rounds", "1", "--out", str(out)])
    rows = _rows(out.read_text())
    assert status == 1 and [r[1] for r in rows[1:]] == ["one copy", "pieces, 0 threads", "pieces, 2 threads"], rows
    assert rows[3][3].startswith("failed: RuntimeError: a CUDA error") and float(rows[2][5]) > 0, rows


@pytest.mark.torch
def test_staging_copies_cuda_variants_run_on_a_torch_cpu_stand_in(tmp_path: Path) -> None:
    """The CUDA-only rows (pieces sent to the device as they land, the DMA alone) on a device whose "device"
    tensors are CPU torch tensors: their code runs here before it runs on a GPU."""
    import importlib.util

    import numpy as np
    import torch

    from streamrt.device import HostStream

    spec = importlib.util.spec_from_file_location("staging_copies", ROOT / "benchmarks" / "staging_copies.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    class TorchHost:
        is_cuda = True
        torch_device = torch.device("cpu")

        def stream(self, name: str) -> HostStream:
            return HostStream(name)

        def host_buffer(self, shape: Any, dtype: Any, *, pinned: bool = True) -> Any:
            return torch.from_numpy(np.empty(tuple(shape), dtype))

        def empty(self, shape: Any, dtype: Any) -> Any:
            return torch.full(tuple(shape), float("nan"), dtype=torch.float32)

    lanes = [bench.Lane(TorchHost(), i, 2, (2, 3, 8, 8), seed=i) for i in range(2)]
    try:
        names = [name for name, _, _ in bench.variants([0, 2], 64, cuda=True)]
        assert names == ["one copy", "pieces, 0 threads", "pieces, 2 threads", "DMA alone (slot to device)"]
        for _, make, dma_only in bench.variants([2], 64, cuda=True):
            copier = make()
            try:
                result = bench.measure(lanes, copier, 2, 1, dma_only)  # checks each lane's batch once
            finally:
                if copier is not None:
                    copier.close()
            assert result["gb_per_s"] > 0
    finally:
        for lane in lanes:
            lane.close()


def test_loop_restart_times_both_ways_of_starting_a_file_over(tmp_path: Path) -> None:
    pytest.importorskip("av")
    out = tmp_path / "loop.md"
    _run(tmp_path, "loop_restart.py", "--rounds", "2", "--out", str(out))
    rows = _rows(out.read_text())
    assert [r[1] for r in rows[1:]] == ["reopen (close, open again)", "rewind (seek the same file)"], rows
    assert all(float(r[2]) > 0 for r in rows[1:]) and rows[2][4].endswith("x faster"), rows


def test_live_consumer_measures_the_host_cost_per_frame(tmp_path: Path) -> None:
    _run(tmp_path, "live_consumer.py", "--streams", "4,16", "--seconds", "0.5", "--rounds", "1", "--groups",
         "heap,scan", "--out", str(tmp_path))
    (report,) = tmp_path.glob("*-live-consumer-cpu.md")
    rows = _rows(report.read_text())
    assert rows[0][:6] == ["streams", "pool", "live group", "frames/s (asked)", "dropped", "CPU ms per 1,000 frames"]
    assert [r[:3] for r in rows[1:]] == [["4", "ready", "heap"], ["4", "ready", "scan"], ["16", "ready", "heap"],
                                         ["16", "ready", "scan"]], rows
    assert all(float(r[5]) > 0 and float(r[3].split()[0]) > 0 for r in rows[1:]), rows
    assert "- 16 streams, ready pool: CPU per frame against heap: scan " in report.read_text()


def test_live_consumer_through_a_cpu_decoder_process(tmp_path: Path) -> None:
    pytest.importorskip("av")
    _run(tmp_path, "live_consumer.py", "--streams", "4", "--seconds", "0.5", "--rounds", "1", "--pools",
         "processes", "--out", str(tmp_path))
    (report,) = tmp_path.glob("*-live-consumer-cpu.md")
    (row,) = _rows(report.read_text())[1:]
    assert row[:3] == ["4", "processes", "heap"] and float(row[3].split()[0]) > 0 and float(row[5]) > 0, row


def test_collect_detections_compares_both_ways_on_equal_outputs(tmp_path: Path) -> None:
    out = tmp_path / "collect.md"
    text = _run(tmp_path, "collect_detections.py", "--batches", "1,4", "--rounds", "3", "--out", str(out))
    rows = [r for r in _rows(text) if r and r[0] in ("1", "4")]
    assert [(r[0], r[1]) for r in rows] == [("1", "per frame"), ("1", "whole batch"), ("4", "per frame"),
                                          ("4", "whole batch")]
    assert rows[1][4].endswith("x") and float(rows[1][4][:-1]) > 0 and "commit" in out.read_text()
