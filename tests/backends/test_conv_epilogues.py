"""cuDNN convolution epilogues (``--option conv_epilogues``) on the CPU: the rewrite on real Inductor graphs.

The fused ops are cuDNN's, so the CPU cannot run them; these tests register reference CPU kernels
for the two ATen ops (``relu(conv + bias)``, ``relu(conv + z + bias)``) and let the pass rewrite CPU
convolutions, which exercises what the GPU build does apart from cuDNN itself: which patterns are
matched (batch norm folded by freezing first), the fake implementations' shapes and memory formats,
AOTInductor's proxy-executor calls of the ops, dynamic batch, numerics against eager fp32. The GPU
test (``test_conv_epilogues_gpu.py``) runs the real kernels.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from streamrt.backends.torch_inductor.conv_epilogues import (  # noqa: E402
    CudnnConvEpilogues,
    fused_in_package,
    installed,
    register_fake_impls,
)
from streamrt.backends.torch_inductor.levels import resolve_recipe  # noqa: E402
from streamrt.config import BuildConfig  # noqa: E402
from streamrt.errors import ConfigError  # noqa: E402

WEIGHTS_CHANNELS_LAST: list[bool] = []  # per call of a reference kernel: was its weight stored channels-last?
OPERANDS_CHANNELS_LAST: list[bool] = []  # per call: were its input (and residual) laid out channels-last?


def _record(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor | None = None) -> None:
    WEIGHTS_CHANNELS_LAST.append(w.is_contiguous(memory_format=torch.channels_last))
    OPERANDS_CHANNELS_LAST.append(all(t.is_contiguous(memory_format=torch.channels_last) for t in (x, z)
                                      if t is not None))


def _clear_records() -> None:
    for record in (WEIGHTS_CHANNELS_LAST, OPERANDS_CHANNELS_LAST):
        record.clear()


@pytest.fixture(scope="module")
def reference_kernels() -> Iterator[None]:
    """CPU kernels for the two cuDNN ops, removed again after this module."""
    lib = torch.library.Library("aten", "IMPL")

    def conv_relu(x, w, b, stride, padding, dilation, groups):  # type: ignore[no-untyped-def]
        _record(x, w)
        return F.relu(F.conv2d(x, w, b, stride, padding, dilation, groups))

    def conv_add_relu(x, w, z, alpha, b, stride, padding, dilation, groups):  # type: ignore[no-untyped-def]
        _record(x, w, z)
        return F.relu(F.conv2d(x, w, b, stride, padding, dilation, groups) + (1.0 if alpha is None else alpha) * z)

    lib.impl("cudnn_convolution_relu", conv_relu, "CPU")
    lib.impl("cudnn_convolution_add_relu", conv_add_relu, "CPU")
    yield
    lib._destroy()


class Bottleneck(nn.Module):
    """A 3-channel stem (not eligible: channels not a multiple of 8), a 1x1 conv+BN+ReLU, a 3x3 conv+BN
    added to the block's input, then ReLU: the residual pattern of ResNet-50."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 1, bias=False), nn.BatchNorm2d(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.stem(x))
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + x)


class ProjectionBlock(Bottleneck):
    """A block whose shortcut is a 1x1 convolution + BN to twice the channels (ResNet's downsample): the
    shortcut's folded bias is moved into the fused op, so the shortcut convolution runs without one."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, 2 * channels, 3, padding=1, bias=False), nn.BatchNorm2d(2 * channels)
        self.down, self.bn_down = nn.Conv2d(channels, 2 * channels, 1, bias=False), nn.BatchNorm2d(2 * channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.stem(x))
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + self.bn_down(self.down(x)))


def _model(kind: type[Bottleneck] = Bottleneck) -> nn.Module:
    torch.manual_seed(0)
    net = kind().eval()
    for bn in [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]:  # statistics not the identity
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-0.5, 0.5)
    return net


def _compile(net: nn.Module, mode: str, path: Path) -> dict[str, int]:
    return dict(_compile_pass(net, mode, path).fused)


def _compile_pass(net: nn.Module, mode: str, path: Path) -> CudnnConvEpilogues:
    from torch._inductor import aoti_compile_and_package
    from torch.export import Dim

    ep = torch.export.export(net, (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: Dim.DYNAMIC(min=1, max=8)},))
    with torch.no_grad(), installed(mode, devices=("cpu",)) as rewrite:
        # Freezing folds batch norm into the convolutions (the pattern appears); CPU weight prepacking
        # would turn the convolutions into oneDNN ops before the pass sees them.
        aoti_compile_and_package(ep, package_path=str(path),
                                 inductor_configs={"freezing": True, "cpp.weight_prepack": False})
    assert rewrite is not None
    return rewrite


def test_the_residual_pattern_is_fused_and_matches_eager(reference_kernels: None, tmp_path: Path) -> None:
    from torch._inductor import aoti_load_package

    net = _model()
    fused = _compile(net, "cudnn", tmp_path / "m.pt2")
    assert fused == {"conv_relu": 1, "conv_add_relu": 1}  # the stem (3 channels) is left to Inductor
    assert fused_in_package((tmp_path / "m.pt2").read_bytes()) == fused  # what the builder reports
    runner = aoti_load_package(str(tmp_path / "m.pt2"))
    generator = torch.Generator().manual_seed(7)
    _clear_records()
    for batch in (1, 5):  # the dynamic batch, fresh data each time
        x = torch.randn(batch, 3, 8, 8, generator=generator)
        with torch.no_grad():
            expected, got = net(x), runner(x)
        got = got[0] if isinstance(got, (list, tuple)) else got
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # cuDNN's ops follow the weight's memory format: the pass stores it channels-last (NHWC kernels)
    assert WEIGHTS_CHANNELS_LAST and all(WEIGHTS_CHANNELS_LAST), WEIGHTS_CHANNELS_LAST
    # and Inductor hands them their input and residual channels-last too (cuDNN would convert both otherwise),
    # also the stem's output, which an Inductor kernel (bias + ReLU) writes
    assert OPERANDS_CHANNELS_LAST and all(OPERANDS_CHANNELS_LAST), OPERANDS_CHANNELS_LAST


def test_the_layout_constraint_is_removed_after_the_compile(reference_kernels: None, tmp_path: Path) -> None:
    from torch._inductor import lowering

    op = torch.ops.aten.cudnn_convolution_relu.default
    table = getattr(lowering, "_maybe_layout_constraints", {})
    before = table.get(op)
    _compile(_model(), "cudnn", tmp_path / "m.pt2")
    assert table.get(op) is before


def test_a_projection_shortcuts_bias_moves_into_the_fused_op_and_the_result_matches_eager(
        reference_kernels: None, tmp_path: Path) -> None:
    from torch._inductor import aoti_load_package

    net = _model(ProjectionBlock)
    rewrite = _compile_pass(net, "cudnn", tmp_path / "p.pt2")
    assert rewrite.fused == {"conv_relu": 1, "conv_add_relu": 1} and rewrite.shortcut_biases == 1
    runner = aoti_load_package(str(tmp_path / "p.pt2"))
    for batch in (1, 3):
        x = torch.randn(batch, 3, 8, 8, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            expected, got = net(x), runner(x)
        got = got[0] if isinstance(got, (list, tuple)) else got
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


class BiasedShortcut(nn.Module):
    """Convolutions with their own biases, no batch norm: ``relu(conv(x) + b + conv_ds(x) + b_ds)``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.down = nn.Conv2d(16, 32, 3, padding=1), nn.Conv2d(16, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x) + self.down(x))


@pytest.mark.parametrize("freezing", [False, True])
def test_shortcut_biases_are_summed_as_constants_when_frozen_and_in_the_graph_when_not(
        reference_kernels: None, tmp_path: Path, freezing: bool) -> None:
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    torch.manual_seed(1)
    net = BiasedShortcut().eval()
    ep = torch.export.export(net, (torch.randn(2, 16, 8, 8),))
    with torch.no_grad(), installed("cudnn", devices=("cpu",)) as rewrite:
        aoti_compile_and_package(ep, package_path=str(tmp_path / "b.pt2"),
                                 inductor_configs={"freezing": freezing, "cpp.weight_prepack": False})
    assert rewrite is not None and rewrite.fused["conv_add_relu"] == 1 and rewrite.shortcut_biases == 1
    x = torch.randn(2, 16, 8, 8)
    _clear_records()
    got = aoti_load_package(str(tmp_path / "b.pt2"))(x)
    with torch.no_grad():
        torch.testing.assert_close(got[0] if isinstance(got, (list, tuple)) else got, net(x), rtol=1e-4, atol=1e-4)
    # the graph's contiguous input is handed to the fused op channels-last (one Inductor copy, not cuDNN's own)
    assert OPERANDS_CHANNELS_LAST == [True], OPERANDS_CHANNELS_LAST


def test_spatial_mode_leaves_1x1_convolutions_to_inductor(reference_kernels: None, tmp_path: Path) -> None:
    assert _compile(_model(), "cudnn_spatial", tmp_path / "s.pt2") == {"conv_relu": 0, "conv_add_relu": 1}


def test_inductor_mode_installs_nothing() -> None:
    import torch._inductor.config as inductor_config

    before = inductor_config.post_grad_custom_post_pass
    with installed("inductor") as rewrite:
        assert rewrite is None
        assert inductor_config.post_grad_custom_post_pass is before


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_fake_impls_follow_cudnns_memory_format(layout: torch.memory_format) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    register_fake_impls()
    with FakeTensorMode():
        x = torch.empty(2, 16, 9, 9).contiguous(memory_format=layout)
        w = torch.empty(32, 16, 3, 3)
        out = torch.ops.aten.cudnn_convolution_relu(x, w, None, [2, 2], [1, 1], [1, 1], 1)
        added = torch.ops.aten.cudnn_convolution_add_relu(x, w, torch.empty(2, 32, 5, 5), None, None,
                                                          [2, 2], [1, 1], [1, 1], 1)
    for t in (out, added):
        assert tuple(t.shape) == (2, 32, 5, 5)
        assert t.is_contiguous(memory_format=layout)


def _config(**options: object) -> BuildConfig:
    return BuildConfig(backend="torch_inductor", optimization_level=5, backend_options=dict(options))


def test_the_option_is_validated_and_recorded() -> None:
    assert resolve_recipe(_config(), "cuda").to_dict()["conv_epilogues"] == "cudnn"  # level 5's default on CUDA
    assert resolve_recipe(_config(), "cpu").to_dict()["conv_epilogues"] == "inductor"
    assert resolve_recipe(_config(conv_epilogues="cudnn_spatial"), "cuda").conv_epilogues == "cudnn_spatial"
    with pytest.raises(ConfigError, match="must be one of inductor, cudnn, cudnn_spatial, got 'fast'"):
        resolve_recipe(_config(conv_epilogues="fast"), "cuda")
    with pytest.raises(ConfigError, match="needs a CUDA build"):
        resolve_recipe(_config(conv_epilogues="cudnn"), "cpu")
