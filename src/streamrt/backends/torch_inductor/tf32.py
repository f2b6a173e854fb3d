"""The torch math switches a torch_inductor plan builds and runs under, set and restored around use.

TF32 tensor-core math for fp32 matmuls and cuDNN convolutions is on (``--tf32``) or off (IEEE
fp32, the default), and cuDNN benchmark mode is on at optimization level 5. These are
process-wide torch flags: :func:`backend_flags` sets them for a build or for one engine call and
puts the caller's values back afterwards, so loading or running a plan never changes the user's
process. They are always set explicitly: torch enables TF32 for cuDNN convolutions by default,
which put fp32 plans 2-3e-4 (relative L2) away from an fp32 reference on the H200.

The legacy ``allow_tf32`` flags are used on purpose: torch.export (2.11-2.13) reads them
internally and raises once the newer ``fp32_precision`` API has set conv and RNN flags, so the
two APIs cannot be mixed here. The flags are global, not per thread: two threads running plans
that disagree on TF32 at the same moment can see each other's setting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["backend_flags", "set_tf32"]


@contextlib.contextmanager
def backend_flags(tf32: bool, cudnn_benchmark: bool = False) -> Iterator[None]:
    """Run the block with TF32 on or off and cuDNN benchmark mode as given; restore them after."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark)
    if before == (tf32, tf32, cudnn_benchmark):
        yield
        return
    matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark = tf32, tf32, cudnn_benchmark
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark = before


def set_tf32(enabled: bool) -> None:
    """TF32 on or off process-wide, without restoring: for callers that own the process (benchmark
    baselines running eager torch). StreamRT's builds and engines use :func:`backend_flags`."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
