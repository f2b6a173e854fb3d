"""05: asynchronous copies from pinned memory, and overlapping copies with compute.

A GPU copies host memory through its copy engines, which run beside the SMs. Two conditions
make a copy asynchronous (the CPU queues it and moves on) and fast: the host buffer is *pinned*
(page-locked, so the copy engine can read it directly; pageable memory is staged through a hidden
pinned buffer, at a third of the speed on the H200), and the copy is issued with
``non_blocking=True`` on a stream other than the one computing. Then the copy of chunk k+1 runs
while chunk k is computed: double buffering.

Part 1 measures pageable vs pinned copy bandwidth; part 2 processes chunks serially on one
stream and double-buffered on a copy stream plus a compute stream, and draws both timelines.
On the CPU (host streams) a "copy" is a memcpy by a worker thread: the code and the overlap are
the same, pinning has no meaning there.

    python examples/05_pinned_async_copies.py [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import _common
import matplotlib.pyplot as plt
import torch

from streamrt.device import get_device

args = _common.parse_args("05", __doc__)
device = get_device(args.device)
mib = 8 if args.small else (256 if device.is_cuda else 64)

# Part 1: bandwidth of one large host-to-device copy, pageable vs pinned.
stream = device.stream("copy")
if not device.is_cuda:
    stream.launch(lambda: torch.set_num_threads(1))  # one core per host stream (see example 04)
dst = device.empty((mib << 20,), torch.uint8)
bandwidth = {}
for pinned in (False, True):
    src = device.host_buffer((mib << 20,), torch.uint8, pinned=pinned)
    src.fill_(1)
    for _ in range(2):  # the second run is measured
        tl = _common.Timeline(stream)
        tl.launch(stream, "copy", lambda src=src: dst.copy_(src, non_blocking=True))
        stream.synchronize()
    (_, start, end, _), = tl.spans()
    label = "pinned" if pinned else "pageable"
    bandwidth[label] = mib / 1024 / ((end - start) / 1e3)
    print(f"{label:<8} host -> {device.kind}: {bandwidth[label]:6.1f} GB/s")

# Part 2: chunks copied in, then computed. Serially on one stream, or double-buffered.
chunks = 4 if args.small else 8
n = 512 if args.small else (4096 if device.is_cuda else 768)
host = [device.host_buffer((n, n), torch.float32, pinned=True) for _ in range(chunks)]
for h in host:
    h.normal_()
dev_in = [device.empty((n, n), torch.float32) for _ in range(2)]  # two buffers: double buffering
weights = torch.randn(n, n, device=device.torch_device)
out = device.empty((n, n), torch.float32)
compute = device.stream("compute")
if not device.is_cuda:
    compute.launch(lambda: torch.set_num_threads(1))


def process(copy_stream, compute_stream) -> list[tuple[str, float, float, str]]:
    tl = _common.Timeline(copy_stream)
    compute_stream.wait(tl.origin)
    computed = [None, None]  # the compute that last read each device buffer
    for k in range(chunks):
        buf = dev_in[k % 2]
        if computed[k % 2] is not None:
            copy_stream.wait(computed[k % 2])  # don't overwrite a buffer still being read
        copied = tl.launch(copy_stream, "copy", lambda b=buf, k=k: b.copy_(host[k], non_blocking=True))
        compute_stream.wait(copied)  # compute chunk k only once it arrived
        computed[k % 2] = tl.launch(compute_stream, "compute", lambda b=buf: torch.matmul(b, weights, out=out))
    copy_stream.synchronize()
    compute_stream.synchronize()
    return tl.spans()


results = {}
for title, streams in (("one stream", (compute, compute)), ("copy stream + compute stream", (stream, compute))):
    process(*streams)  # warm-up
    results[title] = min((process(*streams) for _ in range(3)), key=lambda sp: max(e for _, _, e, _ in sp))

fig = plt.figure(figsize=(9, 6))
ax = fig.add_subplot(3, 1, 1)
ax.barh(list(bandwidth), list(bandwidth.values()), color=["C3", "C2"])
ax.set(xlabel="GB/s", title=f"host -> {device.kind} copy of {mib} MiB")
for i, (title, spans) in enumerate(results.items()):
    total = max(e for _, _, e, _ in spans)
    print(f"{title:<30} {total:8.2f} ms for {chunks} chunks")
    _common.plot_timeline(fig.add_subplot(3, 1, i + 2), spans, f"{title}: {total:.1f} ms")
_common.save(fig, args.out / "copies.png")
stream.close()
compute.close()
