"""The networks of the architecture zoo (:mod:`streamrt.testing.zoo`): small, plain PyTorch, no torchvision.

Each one is the smallest network that still has its family's characteristic operators and data
flow, so an export of it contains what users' real models contain: residual adds and batch
norms (ResNet), depthwise convolutions, hard-swish and squeeze-excitation (MobileNetV3),
patch embedding, multi-head attention, LayerNorm and GELU (ViT), a convolutional feature
extractor feeding a bidirectional LSTM and a CTC log-softmax (CRNN), max pooling, transposed
convolution, bilinear Resize and skip concatenations (U-Net), and PReLU with ceil-mode pooling
(MTCNN's P-Net). The YOLO-style detector lives in :mod:`streamrt.testing.yolo`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CRNN", "MTCNNPNet", "MobileNetLike", "ResNetLike", "UNetLike", "ViTLike", "randomize_norms"]


def randomize_norms(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Give every BatchNorm trained-looking statistics (a fresh one is the identity in eval mode)."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            assert m.weight is not None and m.bias is not None  # affine, as every zoo network builds them
            assert m.running_mean is not None and m.running_var is not None
            with torch.no_grad():
                m.weight.copy_(1 + 0.2 * torch.randn(n, generator=generator))
                m.bias.copy_(0.1 * torch.randn(n, generator=generator))
                m.running_mean.copy_(0.1 * torch.randn(n, generator=generator))
                m.running_var.copy_(0.5 + torch.rand(n, generator=generator))
    return module


def _conv_bn(cin: int, cout: int, k: int = 3, s: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.a = _conv_bn(cin, cout, 3, stride)
        self.b = _conv_bn(cout, cout, 3)
        self.down = _conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b(F.relu(self.a(x))) + self.down(x))


class ResNetLike(nn.Module):
    """Stem, three stages of basic blocks (strides 1, 2, 2), global average pool, linear classifier."""

    def __init__(self, classes: int = 10, width: int = 16) -> None:
        super().__init__()
        w = width
        self.stem = _conv_bn(3, w)
        self.stages = nn.Sequential(
            _BasicBlock(w, w, 1), _BasicBlock(w, 2 * w, 2), _BasicBlock(2 * w, 4 * w, 2), _BasicBlock(4 * w, 4 * w, 1)
        )
        self.fc = nn.Linear(4 * w, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stages(F.relu(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class _SqueezeExcite(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(c, max(8, c // 4), 1)
        self.expand = nn.Conv2d(max(8, c // 4), c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(s))))


class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        hidden = cin * expand
        self.expand = _conv_bn(cin, hidden, 1)
        self.depthwise = _conv_bn(hidden, hidden, 3, stride, groups=hidden)
        self.se = _SqueezeExcite(hidden)
        self.project = _conv_bn(hidden, cout, 1)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.hardswish(self.expand(x))
        y = self.project(self.se(F.hardswish(self.depthwise(y))))
        return x + y if self.residual else y


class MobileNetLike(nn.Module):
    """MobileNetV3-style: hard-swish stem, inverted residuals with depthwise convs and SE, classifier."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 16, 3, 2)
        self.blocks = nn.Sequential(
            _InvertedResidual(16, 16, 1),
            _InvertedResidual(16, 24, 2),
            _InvertedResidual(24, 24, 1),
            _InvertedResidual(24, 40, 2),
        )
        self.head = nn.Linear(40, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(F.hardswish(self.stem(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class _EncoderLayer(nn.Module):
    """Pre-norm transformer encoder layer with attention written out (as exporters unroll it)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = torch.softmax(q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5, dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class ViTLike(nn.Module):
    """Patch embedding (8x8 on 32x32 images), class token, position embeddings, 2 encoder layers."""

    def __init__(self, classes: int = 10, dim: int = 64, heads: int = 4, image: int = 32, patch: int = 8) -> None:
        super().__init__()
        tokens = (image // patch) ** 2
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(0.02 * torch.randn(1, 1, dim))
        self.pos = nn.Parameter(0.02 * torch.randn(1, tokens + 1, dim))
        self.layers = nn.Sequential(_EncoderLayer(dim, heads), _EncoderLayer(dim, heads))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.embed(x).flatten(2).transpose(1, 2)
        y = torch.cat([self.cls.expand(y.shape[0], -1, -1), y], dim=1) + self.pos
        return self.head(self.norm(self.layers(y))[:, 0])


class CRNN(nn.Module):
    """Text-line recognizer: conv features (height 32 -> 1), bidirectional LSTM, CTC log-probabilities.

    Input ``(batch, 1, 32, width)``; output ``(batch, width // 4, classes)`` log-softmax over classes
    (class 0 is CTC's blank).
    """

    def __init__(self, classes: int = 20, hidden: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Conv2d(16, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Conv2d(32, 48, 3, 1, 1), nn.ReLU(), nn.MaxPool2d((2, 1), (2, 1)),
            nn.Conv2d(48, 48, 3, 1, 1), nn.BatchNorm2d(48), nn.ReLU(), nn.MaxPool2d((2, 1), (2, 1)),
            nn.Conv2d(48, 64, (2, 1)), nn.ReLU(),
        )  # fmt: skip
        self.rnn = nn.LSTM(64, hidden, bidirectional=True)
        self.classifier = nn.Linear(2 * hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features(x).squeeze(2).permute(2, 0, 1)  # (T, B, C)
        y, _ = self.rnn(f)
        return F.log_softmax(self.classifier(y), dim=-1).permute(1, 0, 2)


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(_conv_bn(cin, cout), nn.ReLU(), _conv_bn(cout, cout), nn.ReLU())


class UNetLike(nn.Module):
    """Two-level U-Net: max-pool encoder, a ConvTranspose and a bilinear Resize decoder, skip concats.

    Runs at heights and widths that are multiples of 4 (two 2x2 poolings).
    """

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.enc1, self.enc2, self.mid = _double_conv(3, 16), _double_conv(16, 32), _double_conv(32, 64)
        self.up2 = nn.ConvTranspose2d(64, 32, 2, 2)
        self.dec2 = _double_conv(64, 32)
        self.reduce1 = nn.Conv2d(32, 16, 1)
        self.dec1 = _double_conv(32, 16)
        self.out = nn.Conv2d(16, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        up1 = F.interpolate(self.reduce1(d2), scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.out(self.dec1(torch.cat([up1, e1], dim=1)))


class MTCNNPNet(nn.Module):
    """MTCNN's proposal network: fully convolutional, PReLU, 2x2 max pool with ceil mode.

    Outputs a face probability map (softmax over 2 channels) and box regressions, at any input
    size from 12x12 up (an image pyramid runs it at many sizes, most of them odd).
    """

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 10, 3), nn.PReLU(10), nn.MaxPool2d(2, 2, ceil_mode=True),
            nn.Conv2d(10, 16, 3), nn.PReLU(16), nn.Conv2d(16, 32, 3), nn.PReLU(32),
        )  # fmt: skip
        self.prob = nn.Conv2d(32, 2, 1)
        self.box = nn.Conv2d(32, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.body(x)
        return torch.softmax(self.prob(y), dim=1), self.box(y)
