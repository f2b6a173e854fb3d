"""10: serving several models, and reading the server's metrics.

``streamrt serve REPO`` speaks the KServe v2 / Triton protocol. A repository holds one folder
per model, a numbered folder per version, and an optional ``config.yaml``:
``REPO/NAME/1/model.plan``. Each model gets a *dynamic batcher*: requests that arrive within
``max_queue_delay_microseconds`` of each other are run as one batch, which is how a server keeps
a GPU busy with many small requests. The metrics (Prometheus text, Triton's names) say how well
that worked: inferences / executions = the average batch size; the queue time is what batching
cost each request.

This script builds two plans into a repository, serves them in-process (``ServerThread``; the
same server as the CLI), sends concurrent requests to both over plain HTTP/JSON, and reads the
metrics back.

    python examples/10_serving.py [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import _common
import matplotlib.pyplot as plt
import numpy as np
import onnx

import streamrt
from streamrt.serve import ServerConfig, ServerThread
from streamrt.testing.models import CATALOGUE

args = _common.parse_args("10", __doc__)
repo = args.out / "models"
kind = "KIND_GPU" if args.device == "cuda" else "KIND_CPU"
for name, catalogue in (("cnn", "small_cnn"), ("mlp", "dynamic_batch")):
    folder = repo / name / "1"
    folder.mkdir(parents=True, exist_ok=True)
    model = CATALOGUE[catalogue]
    config = streamrt.BuildConfig(backend=_common.backend_for(args.device), profiles=model.profiles)
    onnx.save(model.make(), args.out / f"{name}.onnx")
    streamrt.build(args.out / f"{name}.onnx", config, folder / "model.plan")
    max_batch = model.profiles[0].ranges[next(iter(model.profiles[0].ranges))].max[0]
    (repo / name / "config.yaml").write_text(
        f"max_batch_size: {max_batch}\n"
        "dynamic_batching: {max_queue_delay_microseconds: 2000}\n"
        f"instance_group: [{{count: 1, kind: {kind}}}]\n")
print(f"repository {repo}: " + ", ".join(sorted(p.name for p in repo.iterdir())))


def infer(port: int, name: str, x: np.ndarray) -> float:
    """One KServe v2 JSON request; returns its latency in ms."""
    body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{name}/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        outputs = json.loads(response.read())["outputs"]
    assert outputs and outputs[0]["shape"][0] == x.shape[0]
    return (time.perf_counter() - start) * 1e3


def metrics(port: int) -> dict[tuple[str, str], float]:
    """The server's counters by (metric, model)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("nv_inference_") and 'model="' in line:
            metric, rest = line.split("{", 1)
            model = rest.split('model="', 1)[1].split('"', 1)[0]
            values[(metric, model)] = values.get((metric, model), 0.0) + float(line.rsplit(" ", 1)[1])
    return values


rng = np.random.default_rng(0)
samples = {"cnn": lambda: rng.standard_normal((1, 3, 32, 32), dtype=np.float32),
           "mlp": lambda: rng.standard_normal((1, 4, 6), dtype=np.float32)}
requests = 24 if args.small else 400
latencies: dict[str, list[float]] = {"cnn": [], "mlp": []}
with ServerThread(repo, ServerConfig(http_port=0, grpc_port=None, metrics_port=0)) as server:
    print(f"serving on http://127.0.0.1:{server.http_port}, metrics on :{server.metrics_port}")
    jobs = [(name, samples[name]()) for _ in range(requests) for name in latencies]
    with ThreadPoolExecutor(max_workers=8) as clients:  # 8 concurrent clients: the batcher has work to combine
        for (name, _), ms in zip(jobs, clients.map(lambda job: infer(server.http_port, *job), jobs), strict=True):
            latencies[name].append(ms)
    counters = metrics(server.metrics_port)

print(f"\n{'model':<5} {'requests':>8} {'executions':>10} {'avg batch':>9} {'queue us/req':>12} {'p50 ms':>7}")
avg_batch = {}
for name, lat in latencies.items():
    ok = counters[("nv_inference_request_success", name)]
    execs = counters[("nv_inference_exec_count", name)]
    avg_batch[name] = counters[("nv_inference_count", name)] / execs
    queue = counters[("nv_inference_queue_duration_us", name)] / ok
    print(f"{name:<5} {ok:8.0f} {execs:10.0f} {avg_batch[name]:9.2f} {queue:12.0f} {np.median(lat):7.2f}")
    assert ok == requests, f"{name}: {ok} of {requests} requests succeeded"

fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
a.hist(list(latencies.values()), bins=20, label=list(latencies))
a.set(xlabel="request latency ms", ylabel="requests", title="client side")
a.legend()
b.bar(list(avg_batch), list(avg_batch.values()), color=["C0", "C1"])
b.set(ylabel="inferences / executions", title="average batch the batcher formed")
_common.save(fig, args.out / "serving.png")
