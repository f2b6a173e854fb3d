"""Prometheus ``/metrics`` with Triton's metric names, so existing dashboards work unchanged.

The text format is written here (a dozen lines) rather than with prometheus_client, whose
counters always gain a ``_total`` suffix that Triton's names do not have.

Per model and version (labels ``model``, ``version``), read from :class:`ModelStats` at scrape
time: ``nv_inference_request_success``, ``nv_inference_request_failure`` (label ``reason``),
``nv_inference_count``, ``nv_inference_exec_count``, ``nv_inference_pending_request_count``,
the cumulative ``nv_inference_{request,queue,compute_input,compute_infer,compute_output}_duration_us``
and ``nv_model_load_duration_secs``. Per GPU (label ``gpu_uuid``), through NVML when the
``nvidia-ml-py`` package and a GPU are present: ``nv_gpu_utilization`` (0..1),
``nv_gpu_memory_total_bytes``, ``nv_gpu_memory_used_bytes``, ``nv_gpu_power_usage`` (W),
``nv_gpu_power_limit`` (W), ``nv_energy_consumption`` (J).

Histograms (Triton exposes quantile *summaries* ``nv_inference_*_summary_us``, which cannot be
aggregated across servers; these histograms can, so they carry StreamRT names), per model and
version: ``streamrt_request_duration_us`` (per request, receipt to response, success or failure),
``streamrt_queue_duration_us`` (per request), ``streamrt_compute_duration_us`` (per execution:
input + infer + output) and ``streamrt_batch_size`` (rows per execution). Buckets are in
:mod:`streamrt.serve.observability.stats`. ``streamrt_model_ready`` (1 per served version) lets alerts see a
version that disappears.

Per ensemble step (labels ``model``, ``version`` of the ensemble, ``step`` its index in the config,
``step_model`` the model it runs): ``streamrt_ensemble_step_success``,
``streamrt_ensemble_step_failure`` and the histogram ``streamrt_ensemble_step_duration_us`` (one
step request, receipt to response, success or failure). The composing models' own series count
their step requests too, as Triton counts them.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from streamrt._optional import available, require
from streamrt.serve.observability.stats import Histogram

if TYPE_CHECKING:
    from aiohttp import web

    from streamrt.serve.core import ServerCore

__all__ = ["collect", "render", "start_metrics"]

log = logging.getLogger(__name__)

# (name, help, value from ModelStats); counters in the Prometheus sense.
_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds",
     lambda s: (s.success.ns + s.fail.ns) // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     lambda s: s.compute_output.ns // 1000),
)
_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
_GPU = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "GPU power usage in watts"),
    ("nv_gpu_power_limit", "GPU power management limit in watts"),
    ("nv_energy_consumption", "GPU energy consumption in joules since the server started"),
)


def _gpu_readings() -> list[tuple[str, list[float]]]:
    """Per-GPU (uuid, values in _GPU order) through NVML; empty without pynvml or a GPU."""
    if not available("pynvml"):
        return []
    pynvml = require("pynvml", extra="serve", purpose="GPU metrics")
    try:
        pynvml.nvmlInit()
        readings = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            readings.append((
                uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                [
                    pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                    float(memory.total),
                    float(memory.used),
                    pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                    pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0,
                    pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0,
                ],
            ))
        return readings
    except Exception:
        log.debug("NVML readings failed", exc_info=True)
        return []


Sample = tuple[dict[str, str], float] | tuple[str, dict[str, str], float]
Family = tuple[str, str, str, list[Sample]]
"""(name, type, help, samples of (labels, value) or (name suffix, labels, value))."""

# (name, help, key in ModelStats.histograms()).
_HISTOGRAMS = (
    ("streamrt_request_duration_us", "Inference request duration (receipt to response) in microseconds",
     "request"),
    ("streamrt_queue_duration_us", "Time a request waited in the queue, in microseconds", "queue"),
    ("streamrt_compute_duration_us", "Duration of one model execution (input + infer + output) in microseconds",
     "compute"),
    ("streamrt_batch_size", "Rows per model execution", "batch_size"),
)


def _histogram_samples(labels: dict[str, str], histogram: Histogram) -> list[Sample]:
    samples: list[Sample] = [
        ("_bucket", {**labels, "le": "+Inf" if math.isinf(le) else f"{le:g}"}, float(count))
        for le, count in histogram.cumulative()
    ]
    samples += [("_sum", labels, histogram.sum), ("_count", labels, float(histogram.count))]
    return samples


def collect(server: ServerCore) -> list[Family]:
    """Metric families for the current state of ``server``."""
    served = server.repository.served() if server.repository else []

    def ids(m: Any) -> dict[str, str]:
        return {"model": m.name, "version": str(m.version)}

    families: list[Family] = [
        (name, "counter", text, [(ids(m), float(value(m.stats))) for m in served]) for name, text, value in _COUNTERS
    ]
    families.append((
        "nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes",
        [({**ids(m), "reason": r}, float(m.stats.failures.get(r, 0))) for m in served for r in _REASONS],
    ))
    families.append((
        "nv_inference_pending_request_count", "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
        [(ids(m), float(m.pending)) for m in served],
    ))
    families.append((
        "nv_model_load_duration_secs", "gauge", "Model load time in seconds",
        [(ids(m), m.load_seconds) for m in served],
    ))
    families.append((
        "streamrt_model_ready", "gauge", "1 for every model version loaded and serving",
        [(ids(m), 1.0) for m in served],
    ))
    histograms = [(ids(m), m.stats.histograms()) for m in served]
    for name, text, key in _HISTOGRAMS:
        samples: list[Sample] = []
        for labels, per_model in histograms:
            samples += _histogram_samples(labels, per_model[key])
        families.append((name, "histogram", text, samples))
    families += _step_families(served)
    readings = _gpu_readings()
    for i, (name, text) in enumerate(_GPU):
        families.append((name, "gauge", text, [({"gpu_uuid": uuid}, values[i]) for uuid, values in readings]))
    return families


def _step_families(served: list[Any]) -> list[Family]:
    """The per-step series of every ensemble among ``served``."""
    success: list[Sample] = []
    failure: list[Sample] = []
    durations: list[Sample] = []
    for m in served:
        for step in m.stats.steps():
            labels = {"model": m.name, "version": str(m.version), "step": str(step.index), "step_model": step.model}
            success.append((labels, float(step.success.count)))
            failure.append((labels, float(step.fail.count)))
            durations += _histogram_samples(labels, step.duration_us)
    return [
        ("streamrt_ensemble_step_success", "counter", "Number of successful requests of an ensemble step", success),
        ("streamrt_ensemble_step_failure", "counter", "Number of failed requests of an ensemble step", failure),
        ("streamrt_ensemble_step_duration_us", "histogram",
         "Duration of one ensemble step request (sent to the step's model to its response) in microseconds",
         durations),
    ]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(server: ServerCore) -> bytes:
    """Prometheus text exposition (format 0.0.4) of :func:`collect`, names exactly as Triton's."""
    lines = []
    for name, kind, text, samples in collect(server):
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for sample in samples:
            suffix, labels, value = sample if len(sample) == 3 else ("", *sample)
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            number = repr(value) if value != int(value) else str(int(value))
            lines.append(f"{name}{suffix}{{{label_text}}} {number}")
    return ("\n".join(lines) + "\n").encode()


async def start_metrics(server: ServerCore, host: str, port: int) -> tuple[Any, int]:
    """Serve ``GET /metrics`` on its own port (Triton's 8002); returns the runner and the bound port."""
    require("aiohttp", extra="serve", purpose="the metrics listener")
    from aiohttp import web

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=render(server), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    return runner, int(runner.addresses[0][1])
