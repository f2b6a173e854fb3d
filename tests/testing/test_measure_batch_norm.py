"""measure_batch_norm: random-weight networks whose eval-mode activations vanish get usable ones."""

from __future__ import annotations

import torch
from torch import nn

from streamrt.testing.zoo import measure_batch_norm


def vanishing_net() -> nn.Module:
    """Conv (no bias) + BN (running mean 0, variance 1) + ReLU, 12 times: each layer shrinks the signal."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(12):
        layers += [nn.Conv2d(8 if i else 3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()]
    return nn.Sequential(*layers)


def test_measured_statistics_bring_vanishing_activations_back_into_fp16_range() -> None:
    x = torch.randn(2, 3, 16, 16)
    net = vanishing_net().eval()
    with torch.no_grad():
        before = net(x).abs().max().item()
        measured = measure_batch_norm(net, (3, 16, 16))
        after = measured(x).abs().max().item()
    assert before < 1e-3  # below what fp16 keeps with any precision after a few more layers
    assert after > 0.05
    assert measured is net and not net.training


def test_a_network_without_batch_norm_is_left_as_it_was() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    state = {k: v.clone() for k, v in net.state_dict().items()}
    measure_batch_norm(net.train(), (4,))
    assert not net.training
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
