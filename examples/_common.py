"""What every example shares: its command line, timing, and drawing a timeline.

Each example takes ``--device auto|cpu|cuda`` (auto: CUDA when torch sees a GPU), ``--out DIR``
(default ``out/examples/NN``, which git ignores) and ``--small`` (or ``STREAMRT_EXAMPLES_SMALL=1``)
for the quick sizes the test suite uses.

Importing this module (every example does it first) installs :func:`missing_extra_guard`: an
example that needs an extra which is not installed (torch, matplotlib, the server's aiohttp...)
ends with one line naming what to install and exit status 2, as the ``streamrt`` command does,
instead of a traceback.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from streamrt._optional import missing_dependency


def missing_extra_guard(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """``sys.excepthook`` for the examples: a missing optional package is one line and exit status 2.

    Any other exception goes to the previous hook (the usual traceback). Installed at import, before
    this module's own ``import matplotlib``, so a missing matplotlib is reported the same way.
    """
    missing = missing_dependency(exc)
    if missing is None:
        _previous_hook(kind, exc, tb)
        return
    script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "example"
    print(f"{script}: error: {missing}", file=sys.stderr, flush=True)
    sys.exit(2)  # from inside the hook, Python exits with this status


_previous_hook = sys.excepthook
sys.excepthook = missing_extra_guard

import matplotlib  # noqa: E402  (after the guard: a missing matplotlib is one line too)

matplotlib.use("Agg")  # write PNG files; no window
import matplotlib.pyplot as plt  # noqa: E402

from streamrt.device import cuda_available  # noqa: E402


def parse_args(number: str, doc: str | None, add: Callable[[argparse.ArgumentParser], None] | None = None,
               argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the shared flags; ``args.device`` comes back resolved to ``"cpu"`` or ``"cuda"``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to run (default auto: CUDA when available)")
    parser.add_argument("--out", type=Path, default=Path("out/examples") / number,
                        help=f"where figures and files go (default out/examples/{number})")
    parser.add_argument("--small", action="store_true", default=os.environ.get("STREAMRT_EXAMPLES_SMALL") == "1",
                        help="small sizes (what the tests run)")
    if add is not None:
        add(parser)
    args = parser.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if cuda_available() else "cpu"
    elif args.device == "cuda" and not cuda_available():
        sys.exit("error: --device cuda, but torch sees no CUDA GPU (hint: use --device cpu)")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"[{number}] device {args.device}, outputs in {args.out}")
    return args


def backend_for(device: str) -> str:
    """The backend an example builds with: the GPU backend on CUDA, ONNX Runtime on the CPU."""
    return "torch_inductor" if device == "cuda" else "onnxruntime"


def synchronize(device: str) -> None:
    """Wait for queued GPU work (CUDA work is asynchronous: a timer must wait for it)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def median_ms(fn: Callable[[], Any], device: str, repeat: int = 20, warmup: int = 3) -> float:
    """Median wall time of ``fn`` in milliseconds, the GPU synchronised around every call."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def plot_timeline(ax: Any, spans: Sequence[tuple[str, float, float, str]], title: str) -> None:
    """Draw ``(track, start_ms, end_ms, label)`` spans, one row per track."""
    tracks = list(dict.fromkeys(track for track, *_ in spans))
    colours = plt.get_cmap("tab10")
    labels = list(dict.fromkeys(label for *_, label in spans))
    for track, start, end, label in spans:
        row = tracks.index(track)
        ax.broken_barh([(start, max(end - start, 1e-3))], (row - 0.4, 0.8),
                       color=colours(labels.index(label) % 10))
    ax.set_yticks(range(len(tracks)), tracks)
    ax.set_xlabel("ms")
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(i % 10)) for i in range(len(labels))]
    ax.legend(handles, labels, loc="upper right", fontsize="small")


def save(fig: Any, path: Path) -> Path:
    """Write a figure as PNG and say where."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return path


class Timeline:
    """Launch work on streams between timing events, and read back the spans once it ran.

    >>> tl = Timeline(first_stream)
    >>> tl.launch(stream, "copy 0", lambda: dst.copy_(src, non_blocking=True))
    >>> spans = tl.spans()   # after the streams were synchronised
    """

    def __init__(self, origin: Any) -> None:
        self._t0 = origin.new_event(timing=True)
        origin.record(self._t0)
        self._marks: list[tuple[str, Any, Any, str]] = []

    @property
    def origin(self) -> Any:
        """The event every span is measured from (other streams should wait for it first)."""
        return self._t0

    def launch(self, stream: Any, label: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on ``stream`` between two timing events; return the end event."""
        start, end = stream.new_event(timing=True), stream.new_event(timing=True)
        stream.record(start)
        stream.launch(fn)
        stream.record(end)
        self._marks.append((stream.name, start, end, label))
        return end

    def spans(self) -> list[tuple[str, float, float, str]]:
        return [(track, self._t0.elapsed_ms(s), self._t0.elapsed_ms(e), label) for track, s, e, label in self._marks]
