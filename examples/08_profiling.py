"""08: profiling: reading ``bench``, the per-layer table, a timeline, NVTX.

Three questions, three tools:

1. *How fast, and can I trust the number?* ``streamrt bench`` (trtexec's summary): throughput,
   latency percentiles, and warnings. Read the median, not the mean (one stall moves the mean);
   p99 is what a user waits for at worst; the coefficient of variation (CoV) says whether the
   machine was quiet: above 2.5 % ``bench`` warns, and so do ``demo`` and ``pipeline-bench``.
2. *Where does the time go?* ``streamrt profile``: the backend's own per-layer profiler; optimise
   the top rows first (here the convolutions).
3. *Do the queries run steadily?* ``bench --export-times``: one record per query; plotted over
   time, stalls and warm-up show as spikes.

On a GPU, also run ``nsys profile -t cuda,nvtx streamrt pipeline-bench --device cuda`` (or build a
``Pipeline`` with ``PipelineConfig(nvtx=True)``): every pipeline stage appears as an NVTX range
above its kernels in Nsight Systems.

    python examples/08_profiling.py [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import json
import subprocess
import sys

import _common
import matplotlib.pyplot as plt
import onnx

import streamrt
from streamrt.measure.stats import Stats
from streamrt.testing.models import CATALOGUE, small_cnn

args = _common.parse_args("08", __doc__)
onnx_path = args.out / "cnn.onnx"
onnx.save(small_cnn(), onnx_path)
config = streamrt.BuildConfig(backend=_common.backend_for(args.device), profiles=CATALOGUE["small_cnn"].profiles)
plan = streamrt.build(onnx_path, config, args.out / "cnn.plan").path


def streamrt_cli(*argv: str) -> str:
    """Run a ``streamrt`` subcommand, as you would in a shell, and return what it printed."""
    done = subprocess.run([sys.executable, "-m", "streamrt.cli.main", *argv], capture_output=True, text=True,
                          check=True)
    return done.stdout


duration = "0.5" if args.small else "3"
times = args.out / "times.json"
print(streamrt_cli("bench", str(plan), "--batch", "8", "--duration", duration, "--export-times", str(times)))

# Reading it: the figures below are the table's own, recomputed from the per-query times that
# same run wrote (--export-times), with the statistics bench uses; a second run would differ.
queries = json.loads(times.read_text())
latency = Stats.from_samples(q["latencyMs"] for q in queries)
print(f"reading it (the {latency.count} queries above):")
print(f"- median {latency.median:.3f} ms is the typical query; mean {latency.mean:.3f} ms is pulled up by "
      f"stalls (max {latency.max:.2f} ms)")
print(f"- p99 {latency.p99:.3f} ms: 1 query in 100 waits at least this long")
print(f"- CoV {latency.cov:.1f}%: " + ("steady (at most 2.5 %)" if latency.cov <= 2.5 else
      "over 2.5 %, so the machine was busy: the Warnings above say what to do"))

layers = json.loads(streamrt_cli("profile", str(plan), "--batch", "8", "--json"))["layers"]
print("\nper-layer time (top 3):")
for layer in layers[:3]:
    print(f"  {layer['name']:<16} {layer['op_type']:<18} {layer['per_iteration_ms']:.4f} ms "
          f"({layer['share_percent']:.0f}%)")

fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
a.plot([q["startEnqMs"] for q in queries], [q["latencyMs"] for q in queries], ".", ms=2)
a.axhline(latency.median, c="C1", label="median")
a.axhline(latency.p99, c="C3", ls="--", label="p99")
a.set(xlabel="time ms", ylabel="latency ms", yscale="log", title="every query of the bench run")
a.legend()
b.barh([f"{x['name']} ({x['op_type']})" for x in layers][::-1], [x["share_percent"] for x in layers][::-1])
b.set(xlabel="% of the time", title="per-layer profile")
_common.save(fig, args.out / "profile.png")
