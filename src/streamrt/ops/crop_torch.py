"""Crop boxes out of a batch of images and resize each to a fixed size, in torch (CPU or CUDA).

:func:`crop_resize` is the crop step of a two-stage detector -> classifier chain: the boxes of
every image (``[N, M, 4]``: x1, y1, x2, y2 in the image's pixels, rows past ``counts`` ignored)
become ``[N, M, C, h, w]`` crops by bilinear sampling at the output pixels' centres
(``torch.nn.functional.grid_sample``, ``align_corners=False``, edge pixels repeated outside the
image): output pixel ``j`` of a box samples ``x1 + (j + 0.5) * (x2 - x1) / w``, the convention of
``torchvision.ops.roi_align(aligned=True, sampling_ratio=1)``, which is not used because
torchvision's CPU build here lacks it. Rows past an image's count are zero. One kernel launch
per call, no host synchronisation: it runs on the caller's device and stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["crop_resize"]


def crop_resize(images: torch.Tensor, boxes: torch.Tensor, counts: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """The ``[N, M, C, size[0], size[1]]`` crops of ``boxes`` (``[N, M, 4]``) out of ``images`` (``[N, C, H, W]``).

    Raises:
        ShapeError: the shapes do not agree (a batch of images vs boxes, a box row not of 4 values).
    """
    import torch
    import torch.nn.functional as F

    from streamrt.errors import ShapeError

    if images.dim() != 4 or boxes.dim() != 3 or boxes.shape[2] != 4 or boxes.shape[0] != images.shape[0] \
            or counts.numel() != images.shape[0]:
        raise ShapeError(f"crop_resize takes images [N, C, H, W], boxes [N, M, 4] and counts [N]; got "
                         f"{list(images.shape)}, {list(boxes.shape)} and {list(counts.shape)}")
    n, c, height, width = images.shape
    m = boxes.shape[1]
    out_h, out_w = size
    boxes = boxes.to(device=images.device, dtype=torch.float32)
    steps_x = (torch.arange(out_w, device=images.device, dtype=torch.float32) + 0.5) / out_w  # [w]
    steps_y = (torch.arange(out_h, device=images.device, dtype=torch.float32) + 0.5) / out_h  # [h]
    x1, y1, x2, y2 = (boxes[..., i].unsqueeze(-1) for i in range(4))  # [N, M, 1]
    xs = (x1 + steps_x * (x2 - x1)) * (2.0 / width) - 1.0  # [N, M, w], align_corners=False coordinates
    ys = (y1 + steps_y * (y2 - y1)) * (2.0 / height) - 1.0  # [N, M, h]
    grid = torch.stack(torch.broadcast_tensors(xs.unsqueeze(2), ys.unsqueeze(3)), dim=-1)  # [N, M, h, w, 2]
    sampled = F.grid_sample(images.float(), grid.reshape(n, m * out_h, out_w, 2), mode="bilinear",
                            padding_mode="border", align_corners=False)  # [N, C, M*h, w]
    crops = sampled.reshape(n, c, m, out_h, out_w).permute(0, 2, 1, 3, 4)
    valid = torch.arange(m, device=images.device).view(1, m) < counts.to(images.device).view(n, 1)
    return (crops * valid.view(n, m, 1, 1, 1)).contiguous()
