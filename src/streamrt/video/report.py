"""The run report of a detection run: throughput, per-frame latency, per-stage times, drops, the bound.

Per-frame latency runs from the moment a frame became available (decoded, or for a paced camera
the instant the camera produced it) to the moment its detections reached the caller, so queueing
in front of the pipeline counts. Stage times and the busiest resource come from the pipeline's
trace (:func:`streamrt.profiling.pipeline_summary.summarize`); :func:`write_report_files` adds the
PNG timeline and the Chrome trace.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamrt.pipeline.tracing import PipelineTrace

__all__ = ["LATENCY_BUDGET_MS", "RunReport", "latency_stats", "per_stream_table", "write_report_files"]

# A paced run "sustains" its cameras when it drops nothing and p99 latency stays under this.
LATENCY_BUDGET_MS = 100.0


def latency_stats(latencies_ms: list[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean of per-frame latencies (empty dict for no frames)."""
    if not latencies_ms:
        return {}
    lat = np.asarray(latencies_ms, np.float64)
    out = {f"p{q}": float(np.percentile(lat, q)) for q in (50, 90, 99)}
    out.update(max=float(lat.max()), mean=float(lat.mean()))
    return out


@dataclass
class RunReport:
    """Numbers of one detection run (the CLI prints :meth:`format_text`; benchmarks use :meth:`to_dict`)."""

    label: str
    model: str
    backend: str
    device: str
    sources: int
    frame_size: str
    batch: int
    frames: int
    wall_s: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    dropped: int = 0
    paced: bool = False
    target_fps: float | None = None
    stage_ms: dict[str, float] = field(default_factory=dict)
    bottleneck: tuple[str, float] | None = None
    detections: int = 0
    trace: PipelineTrace | None = field(default=None, repr=False)
    window_fps: list[float] = field(default_factory=list)
    per_source: list[dict[str, Any]] = field(default_factory=list)
    decode: dict[str, Any] = field(default_factory=dict)  # hybrid decode: pools, capacities, moves
    admission: dict[str, Any] = field(default_factory=dict)  # admission control: the line, counts, capacity
    calls: int = 0  # engine calls while measuring (frames / calls: how full the batches were)
    compute_gaps: dict[str, float] = field(default_factory=dict)  # compute-idle stretches (pipeline_summary)

    @property
    def frames_per_call(self) -> float:
        """Frames per engine call over the measured window (the batch is ``batch`` however few are filled)."""
        return self.frames / self.calls if self.calls else 0.0

    @property
    def ran(self) -> int:
        """Sources that ran (admission control may have refused or queued the rest of ``sources``)."""
        if not self.per_source:
            return self.sources
        return sum(1 for p in self.per_source if p.get("state", "ran") == "ran")

    def _sources_line(self) -> str:
        return f"{self.sources}" if self.ran == self.sources else f"{self.ran} of {self.sources}"

    @property
    def fps(self) -> float:
        """Frames per second over the measured window (all sources together)."""
        return self.frames / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def sustained(self) -> bool:
        """Paced runs: no dropped frame and p99 latency under :data:`LATENCY_BUDGET_MS`."""
        return self.dropped == 0 and self.latency_ms.get("p99", float("inf")) < LATENCY_BUDGET_MS

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("trace")
        out.update(fps=self.fps, sustained=self.sustained, frames_per_call=self.frames_per_call, ran=self.ran)
        return out

    def format_text(self) -> str:
        """A few lines for the terminal."""
        lat = self.latency_ms
        lines = [
            f"{self.label}: {self.frames} frames from {self._sources_line()} source(s) ({self.frame_size}) in "
            f"{self.wall_s:.2f} s = {self.fps:.1f} FPS",
            f"  model {self.model} on {self.backend} ({self.device}), batch {self.batch}, {self.detections} detections",
            f"  latency per frame: p50 {lat.get('p50', float('nan')):.1f} ms, "
            f"p99 {lat.get('p99', float('nan')):.1f} ms, max {lat.get('max', float('nan')):.1f} ms",
        ]
        if len(self.window_fps) > 1:
            from streamrt.measure.rounds import Rounds, noise_warning

            windows = Rounds.of(self.window_fps)
            lines.append(f"  throughput per window: {windows.describe('FPS', 'windows')}")
            kind = "cuda" if self.device.startswith("cuda") else "cpu"
            warning = noise_warning({"throughput": windows}, kind, "and rerun", what="windows")
            if warning and not self.paced:  # a paced run's rate is the camera's, not the machine's
                lines.append(f"  {warning}")
        if self.paced:
            verdict = "sustained" if self.sustained else "NOT sustained"
            lines.append(f"  camera-paced at {self.target_fps:g} FPS per source: {self.dropped} dropped frames, "
                         f"{verdict} (no drops and p99 < {LATENCY_BUDGET_MS:g} ms)")
        if self.decode:
            pools = ", ".join(f"{name} {p['streams']} streams ({p['load_fps']:g} of {p['capacity_fps']:g} frames/s)"
                              for name, p in self.decode.get("pools", {}).items() if p["streams"] or p["capacity_fps"])
            lines.append(f"  decode: {pools}; {self.decode.get('moves', 0)} moves; binding {self.decode.get('binding')}"
                         + ("" if self.decode.get("fits", True) else " (over capacity)"))
        if self.admission:
            lines.append(f"  {self.admission['message']}")
        cameras = [p for p in self.per_source if "reconnects" in p]
        for cam in cameras:
            lines.append(f"  camera {cam['source']}: {cam['frames']} frames, latency p50 {cam['p50_ms'] or 0:.1f} / "
                         f"p99 {cam['p99_ms'] or 0:.1f} ms, {cam['dropped']} dropped (queue full), "
                         f"{cam['reconnects']} reconnects")
        if self.stage_ms:
            lines.append("  stage ms/item: " + ", ".join(f"{k} {v:.2f}" for k, v in self.stage_ms.items()))
        if self.bottleneck:
            lines.append(f"  busiest resource: {self.bottleneck[0]} ({100 * self.bottleneck[1]:.0f}% busy)")
        if self.compute_gaps:
            lines.append(f"  compute idle between calls: {self._gaps_text()}")
        return "\n".join(lines)

    def _gaps_text(self) -> str:
        gaps = self.compute_gaps
        return (f"{100 * gaps['idle_share']:.0f}% of the run, {gaps['over']:.0f} stretches over "
                f"{gaps['over_ms']:g} ms, longest {gaps['longest_ms']:.1f} ms")

    def to_markdown(self) -> str:
        lat = self.latency_ms
        rows = [("config", self.label), ("model", f"{self.model} ({self.backend}, {self.device})"),
                ("sources", f"{self._sources_line()} x {self.frame_size}, batch {self.batch}"),
                ("frames", str(self.frames)), ("throughput", f"{self.fps:.1f} FPS"),
                ("latency p50 / p99 / max", f"{lat.get('p50', float('nan')):.1f} / {lat.get('p99', float('nan')):.1f} "
                                            f"/ {lat.get('max', float('nan')):.1f} ms"),
                ("dropped frames", str(self.dropped))]
        rows += [(f"stage {k}", f"{v:.3f} ms/item") for k, v in self.stage_ms.items()]
        if self.bottleneck:
            rows.append(("busiest resource", f"{self.bottleneck[0]} ({100 * self.bottleneck[1]:.0f}% busy)"))
        if self.compute_gaps:
            rows.append(("compute idle between calls", self._gaps_text()))
        return "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def per_stream_table(report: RunReport) -> str:
    """One row per stream: achieved FPS, frames, drops, p50/p99 capture-to-result latency, state."""
    rows = [("stream", "fps", "frames", "dropped", "p50 ms", "p99 ms", "state")]
    for p in report.per_source:
        p99, p50 = p.get("p99_ms"), p.get("p50_ms")
        rows.append((str(p["source"]), f"{p.get('fps', 0.0):.1f}", str(p["frames"]), str(p.get("dropped", 0)),
                     "-" if p50 is None else f"{p50:.1f}", "-" if p99 is None else f"{p99:.1f}",
                     str(p.get("state", "ran"))))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(v.ljust(w) if c == 0 else v.rjust(w) for c, (v, w) in
                                       enumerate(zip(r, widths, strict=True))) for r in rows)


def write_report_files(report: RunReport, folder: str | Path, stem: str = "run") -> list[Path]:
    """Write ``<stem>.json``, ``<stem>.md``, and when traced ``<stem>_timeline.png`` and ``<stem>_trace.json``."""
    from streamrt.errors import MissingDependencyError
    from streamrt.profiling.timeline import plot_timeline
    from streamrt.profiling.trace import write_chrome_trace

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / f"{stem}.json", out / f"{stem}.md"]
    written[0].write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    written[1].write_text(f"# Detection run: {report.label}\n\n{report.to_markdown()}\n")
    if report.trace is not None and report.trace.spans:
        written.append(write_chrome_trace(report.trace, out / f"{stem}_trace.json"))
        with contextlib.suppress(MissingDependencyError):  # matplotlib is optional; the trace opens in Perfetto
            written.append(plot_timeline(report.trace, out / f"{stem}_timeline.png",
                                         title=f"{report.label}: {report.fps:.0f} FPS"))
    return written
