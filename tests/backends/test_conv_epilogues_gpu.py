"""cuDNN convolution epilogues on the GPU: the fused kernels run, in CUDA graphs, with eager's answers.

A residual network (stem, then bottleneck blocks with batch norm, the pattern of ResNet-50) built at
fp16 with ``conv_epilogues=cudnn`` and with Inductor's own epilogues, both with freezing (batch norm
folded, so the pattern appears). Each plan is checked on fresh random inputs, two different ones per
batch size so a graph replaying stale inputs fails, against the module in float64 (on the CPU):
relative L2 <= 1e-2 (fp16 storage, fp32 accumulation: about 1e-3 here), and the fused plan within
2x of the unfused plan's error. The manifest must record what was fused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

torch = pytest.importorskip("torch")
nn = torch.nn

from streamrt import load  # noqa: E402
from streamrt.building.module_builder import build_module  # noqa: E402
from streamrt.config import BuildConfig  # noqa: E402
from streamrt.types import ShapeProfile  # noqa: E402


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        mid = channels // 4
        self.c1, self.b1 = nn.Conv2d(channels, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.c2, self.b2 = nn.Conv2d(mid, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid)
        self.c3, self.b3 = nn.Conv2d(mid, channels, 1, bias=False), nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        return torch.relu(self.b3(self.c3(y)) + x)


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.ReLU(), Block(64), Block(64),
                        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(), Block(128),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)).eval()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.0)
    return net


def _build(net: nn.Module, tmp: Path, epilogues: str) -> Path:
    profile = ShapeProfile.from_dict({"input": {"min": [1, 3, 64, 64], "opt": [4, 3, 64, 64],
                                                "max": [8, 3, 64, 64]}})
    config = BuildConfig(backend="torch_inductor", precision="fp16", optimization_level=3, profiles=(profile,),
                         backend_options={"device": "cuda", "freezing": True, "conv_epilogues": epilogues})
    built = build_module(net, [torch.randn(4, 3, 64, 64)], tmp / f"{epilogues}.plan", config,
                         input_names=["input"], output_names=["logits"], cache_dir=tmp / f"cache-{epilogues}")
    return built.path


def _rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(got.double() - ref) / torch.linalg.vector_norm(ref))


def test_cudnn_epilogues_match_eager_in_cuda_graphs(tmp_path: Path) -> None:
    net = _net()
    reference = net.double()
    errors: dict[str, list[float]] = {}
    for epilogues in ("cudnn", "inductor"):
        path = _build(_net(), tmp_path, epilogues)
        engine = load(path)
        settings = engine.manifest.build_settings["backend"]
        if epilogues == "cudnn":
            fused = settings["conv_epilogues"]["fused"]
            # 3 blocks x (1x1, 3x3 with ReLU; 1x1 + residual + ReLU), the stride-2 conv; not the 3-channel stem
            assert fused == {"conv_relu": 7, "conv_add_relu": 3}, fused
        ctx = engine.create_context()
        generator = torch.Generator().manual_seed(11)
        errors[epilogues] = []
        try:
            for batch in (4, 4, 1, 8):
                x = torch.randn(batch, 3, 64, 64, generator=generator)
                got = ctx.infer({"input": x.cuda()})["logits"].float().cpu()
                with torch.no_grad():
                    ref = reference(x.double())
                errors[epilogues].append(_rel_l2(got, ref))
        finally:
            ctx.close()
            engine.close()
    print("relative L2 per run:", errors)
    assert max(errors["cudnn"]) <= 1e-2, errors
    assert max(errors["cudnn"]) <= 2 * max(errors["inductor"]) + 1e-3, errors
