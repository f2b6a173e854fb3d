"""The process-wide TF32 switch that both the build and the load side of torch_inductor set."""

from __future__ import annotations

import torch

__all__ = ["set_tf32"]


def set_tf32(enabled: bool) -> None:
    """TF32 tensor-core math for fp32 matmuls and cuDNN convolutions on (tf32) or off (fp32, IEEE).

    Process-wide torch state, set when a plan is built or loaded. It is always set explicitly:
    torch enables TF32 for cuDNN convolutions by default, which put fp32 plans 2-3e-4 (relative
    L2) away from an fp32 reference on the H200. The legacy ``allow_tf32`` flags are used on
    purpose: torch.export (2.11-2.13) reads them internally and raises once the newer
    ``fp32_precision`` API has set conv and RNN flags, so the two APIs cannot be mixed here.
    """
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
