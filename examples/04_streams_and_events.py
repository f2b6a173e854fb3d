"""04: one stream versus several streams chained by events, shown on a timeline.

A stream is an in-order queue: work on one stream runs one piece after another, which is what
you get when every call goes to the default stream. Two streams may run at the same time; an
*event* recorded on one stream and waited for on another orders just the pieces that depend on
each other. Here each item goes through two stages, ``A`` then ``B`` (B of item k needs A of item
k). On one stream everything is serial; with A on one stream and B on another, B of item k
overlaps A of item k+1.

The same code runs on a GPU (torch CUDA streams and events, matrix products as the work) and on
the CPU (host streams: worker threads with in-order queues; the work releases the GIL).

    python examples/04_streams_and_events.py [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import _common
import matplotlib.pyplot as plt
import torch

from streamrt.device import get_device

args = _common.parse_args("04", __doc__)
device = get_device(args.device)
n = 256 if args.small else (1024 if device.is_cuda else 512)  # 1024: one product leaves SMs free
items = 4 if args.small else 6
a = torch.randn(n, n, device=device.torch_device)
b = torch.randn(n, n, device=device.torch_device)
outs = [torch.empty(n, n, device=device.torch_device) for _ in range(items)]  # A's result, B's input
finals = [torch.empty(n, n, device=device.torch_device) for _ in range(items)]  # B's result
repeat = 2 if args.small else 4  # matrix products per stage


def stage(x: torch.Tensor, out: torch.Tensor) -> None:
    for _ in range(repeat):
        torch.matmul(x, b, out=out)


def run(streams: dict[str, object]) -> list[tuple[str, float, float, str]]:
    """Enqueue every item's A and B on the given streams; return the spans measured by events."""
    s_a, s_b = streams["A"], streams["B"]
    timeline = _common.Timeline(s_a)
    s_b.wait(timeline.origin)
    for k in range(items):
        done_a = timeline.launch(s_a, "A", lambda k=k: stage(a, outs[k]))
        s_b.wait(done_a)  # B of item k starts only after A of item k: one event, no host sync
        timeline.launch(s_b, "B", lambda k=k: stage(outs[k], finals[k]))
    s_a.synchronize()
    s_b.synchronize()
    return timeline.spans()


one = device.stream("one stream")
two = {"A": device.stream("stream A"), "B": device.stream("stream B")}
if not device.is_cuda:
    # torch's thread count is per thread: without this each host stream's worker would start its
    # own pool of one thread per core, and on a small machine they would fight over the cores.
    for s in (one, *two.values()):
        s.launch(lambda: torch.set_num_threads(1))
results = {}
for title, streams in (("one stream", {"A": one, "B": one}), ("two streams + events", two)):
    run(streams)  # warm-up: the first use of a stream and of the kernels pays one-time costs
    # Keep the fastest of three runs: on a shared machine one run may be preempted midway.
    results[title] = min((run(streams) for _ in range(3)), key=lambda spans: max(end for _, _, end, _ in spans))
for s in (one, *two.values()):
    s.close()

fig, axes = plt.subplots(2, 1, figsize=(9, 4))
for ax, (title, spans) in zip(axes, results.items(), strict=True):
    total = max(end for _, _, end, _ in spans)
    print(f"{title:<22} {total:8.2f} ms for {items} items")
    _common.plot_timeline(ax, spans, f"{title}: {total:.1f} ms")
_common.save(fig, args.out / "timeline.png")
