"""A YOLOv8-style detector in plain PyTorch (no torchvision), for benchmarks and the bundled demo.

Backbone of Conv-BN-SiLU and C2f blocks, an SPPF block, a PAN neck, and an anchor-free decoupled
head at strides 8/16/32. The head regresses left/top/right/bottom distances from each grid
cell centre and decodes them in the graph, so the output has the YOLOv8 export layout
``(batch, 4 + num_classes, anchors)`` with boxes as centre-x, centre-y, width, height in input
pixels and class scores after a sigmoid: exactly what users' exported YOLOv8/YOLO11 models give.

``yolo_like(width=0.25, depth=0.34)`` is about YOLOv8n's size (3 M parameters).
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["YoloLike", "yolo_like"]


class ConvBnAct(nn.Module):
    def __init__(self, cin: int, cout: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1 = ConvBnAct(c, c, 3)
        self.cv2 = ConvBnAct(c, c, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """Split, n bottlenecks, concatenate every intermediate: YOLOv8's main block."""

    def __init__(self, cin: int, cout: int, n: int, shortcut: bool = True) -> None:
        super().__init__()
        self.c = cout // 2
        self.cv1 = ConvBnAct(cin, 2 * self.c)
        self.cv2 = ConvBnAct((2 + n) * self.c, cout)
        self.blocks = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        for block in self.blocks:
            y.append(block(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        hidden = cin // 2
        self.cv1 = ConvBnAct(cin, hidden)
        self.cv2 = ConvBnAct(hidden * 4, cout)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], 1))


class Head(nn.Module):
    """Decoupled box / class branches per level; boxes decoded to xywh pixels in the graph."""

    def __init__(self, channels: tuple[int, ...], num_classes: int, strides: tuple[int, ...]) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.strides = strides
        box_c, cls_c = max(16, channels[0] // 4), max(channels[0], min(num_classes, 100))
        self.box = nn.ModuleList(
            nn.Sequential(ConvBnAct(c, box_c, 3), ConvBnAct(box_c, box_c, 3), nn.Conv2d(box_c, 4, 1)) for c in channels
        )
        self.cls = nn.ModuleList(
            nn.Sequential(ConvBnAct(c, cls_c, 3), ConvBnAct(cls_c, cls_c, 3), nn.Conv2d(cls_c, num_classes, 1))
            for c in channels
        )
        for conv, s in zip(self.cls, strides, strict=True):
            # prior: about 0.01 objects per cell, as in YOLOv8's bias init
            nn.init.constant_(conv[-1].bias, math.log(5 / num_classes / (640 / s) ** 2))  # type: ignore[index]

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        outs = []
        for feat, box, cls, stride in zip(feats, self.box, self.cls, self.strides, strict=True):
            h, w = feat.shape[2:]
            ys = torch.arange(h, device=feat.device, dtype=feat.dtype) + 0.5
            xs = torch.arange(w, device=feat.device, dtype=feat.dtype) + 0.5
            gy, gx = torch.meshgrid(ys, xs, indexing="ij")
            dist = nn.functional.softplus(box(feat)) * stride  # (b, 4, h, w): left, top, right, bottom
            cx = gx * stride + (dist[:, 2] - dist[:, 0]) / 2
            cy = gy * stride + (dist[:, 3] - dist[:, 1]) / 2
            wh = torch.stack([dist[:, 0] + dist[:, 2], dist[:, 1] + dist[:, 3]], 1)
            boxes = torch.cat([cx.unsqueeze(1), cy.unsqueeze(1), wh], 1)
            scores = cls(feat).sigmoid()
            outs.append(torch.cat([boxes, scores], 1).flatten(2))
        return torch.cat(outs, 2)


class YoloLike(nn.Module):
    """YOLOv8-style detector; ``forward(images)`` -> ``(B, 4 + C, anchors)``."""

    def __init__(self, num_classes: int = 80, width: float = 0.25, depth: float = 0.34) -> None:
        super().__init__()

        def c(x: int) -> int:
            return max(8, int(x * width) // 8 * 8)

        def d(x: int) -> int:
            return max(1, round(x * depth))

        self.stem = nn.Sequential(ConvBnAct(3, c(64), 3, 2), ConvBnAct(c(64), c(128), 3, 2), C2f(c(128), c(128), d(3)))
        self.p3 = nn.Sequential(ConvBnAct(c(128), c(256), 3, 2), C2f(c(256), c(256), d(6)))
        self.p4 = nn.Sequential(ConvBnAct(c(256), c(512), 3, 2), C2f(c(512), c(512), d(6)))
        self.p5 = nn.Sequential(ConvBnAct(c(512), c(1024), 3, 2), C2f(c(1024), c(1024), d(3)), SPPF(c(1024), c(1024)))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.top4 = C2f(c(1024) + c(512), c(512), d(3), shortcut=False)
        self.top3 = C2f(c(512) + c(256), c(256), d(3), shortcut=False)
        self.down3 = ConvBnAct(c(256), c(256), 3, 2)
        self.bot4 = C2f(c(256) + c(512), c(512), d(3), shortcut=False)
        self.down4 = ConvBnAct(c(512), c(512), 3, 2)
        self.bot5 = C2f(c(512) + c(1024), c(1024), d(3), shortcut=False)
        self.head = Head((c(256), c(512), c(1024)), num_classes, (8, 16, 32))

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Backbone and PAN neck: the stride 8/16/32 feature maps the head reads."""
        p3 = self.p3(self.stem(images))
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        t4 = self.top4(torch.cat([self.up(p5), p4], 1))
        t3 = self.top3(torch.cat([self.up(t4), p3], 1))
        b4 = self.bot4(torch.cat([self.down3(t3), t4], 1))
        b5 = self.bot5(torch.cat([self.down4(b4), p5], 1))
        return [t3, b4, b5]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))


def yolo_like(num_classes: int = 80, width: float = 0.25, depth: float = 0.34, seed: int = 0) -> YoloLike:
    """A deterministic, randomly initialised YOLOv8n-sized detector in eval mode."""
    torch.manual_seed(seed)
    return YoloLike(num_classes, width, depth).eval()
