"""PNG timeline of a pipeline trace: one lane per CUDA stream / host thread, so overlap shows.

Colours: H2D copies blue, D2H copies orange, kernels green, host stages grey, and the host time
spent *launching* CUDA stages (``enqueue``) purple. Bars are labelled with the item number when
they are wide enough. By default a window of ``items`` consecutive items from the middle of the
run is drawn, where the pipeline is in its steady state.

How to read it: in a healthy pipeline the copy bars of item ``k+1`` sit under the kernel bars of
item ``k`` on another lane; a lane that is busy end to end is the bound. If the enqueue lane is
solid and the GPU lanes have gaps, Python launch cost is the bound (try CUDA graphs).
"""

from __future__ import annotations

from pathlib import Path

from streamrt._optional import require
from streamrt.pipeline.tracing import ENQUEUE, PipelineTrace, StageSpan
from streamrt.profiling.trace import ordered_tracks

__all__ = ["COLORS", "plot_timeline", "steady_window"]

COLORS = {
    "h2d": "#1f77b4",
    "d2h": "#ff7f0e",
    "compute": "#2ca02c",
    "host": "#7f7f7f",
    ENQUEUE: "#9467bd",
}


def steady_window(trace: PipelineTrace, items: int | None) -> list[StageSpan]:
    """Spans of ``items`` consecutive items from the middle of the run (all spans for None)."""
    if items is None or not trace.spans:
        return list(trace.spans)
    ids = sorted({s.item for s in trace.spans})
    first = ids[max(0, len(ids) // 2 - items // 2)]
    keep = set(ids[ids.index(first): ids.index(first) + items])
    return [s for s in trace.spans if s.item in keep]


def plot_timeline(
    trace: PipelineTrace, path: str | Path, *, items: int | None = 12, title: str | None = None
) -> Path:
    """Draw the trace (or a steady-state window of it) to a PNG file and return its path.

    Raises:
        MissingDependencyError: matplotlib is not installed (extra ``plot``).
        ValueError: the trace has no spans (run with ``PipelineConfig(trace=True)``).
    """
    require("matplotlib", extra="plot", purpose="timeline plots").use("Agg")
    plt = require("matplotlib.pyplot", extra="plot", purpose="timeline plots")
    from matplotlib.patches import Patch
    spans = steady_window(trace, items)
    if not spans:
        raise ValueError("the trace has no spans: run the pipeline with PipelineConfig(trace=True)")
    tracks = [t for t in ordered_tracks(trace) if any(s.track == t for s in spans)]
    row = {t: i for i, t in enumerate(tracks)}
    t0 = min(s.start_ms for s in spans)
    width = max(s.end_ms for s in spans) - t0
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.45 * len(tracks)))
    for span in spans:
        start, dur = span.start_ms - t0, max(span.duration_ms, width * 1e-4)
        y = row[span.track]
        ax.broken_barh([(start, dur)], (y - 0.38, 0.76), facecolors=COLORS.get(span.kind, "#bbbbbb"),
                       edgecolors="white", linewidth=0.3, alpha=0.6 if span.failed else 1.0)
        if dur > width / 60:
            ax.text(start + dur / 2, y, str(span.item), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(tracks)), labels=tracks, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_xlim(0, width * 1.01)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or f"{trace.label}: {trace.items_per_s:.0f} items/s", fontsize=10, loc="left")
    kinds = sorted({s.kind for s in spans}, key=lambda k: list(COLORS).index(k) if k in COLORS else 99)
    ax.legend(handles=[Patch(color=COLORS.get(k, "#bbbbbb"), label=k) for k in kinds], loc="lower right",
              bbox_to_anchor=(1.0, 1.0), fontsize=7, ncol=len(kinds), frameon=False)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out
