"""The field's small networks (pipeline.models.anchors): their stems, their module surface, and the
project's MACs counter checked against PyTorch's FlopCounterMode on every one of them."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from pipeline.models.anchors import WIDTHS, AnchorNet, anchor_name
from pipeline.models.cost import count_macs
from pipeline.models.modules import NO_ARCH

EVERY_ANCHOR = [(arch, width) for arch, widths in WIDTHS.items() for width in widths]


def flop_counter_macs(module: torch.nn.Module, shape: tuple[int, int, int]) -> int:
    module.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(torch.zeros(1, *shape))
    flops = counter.get_total_flops()
    assert flops % 2 == 0
    return flops // 2


@pytest.mark.parametrize(("arch", "width"), EVERY_ANCHOR)
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 48, 48)])
def test_macs_counter_agrees_with_flop_counter_mode(arch: str, width: float, shape: tuple[int, int, int]) -> None:
    net = AnchorNet(arch, width, shape[0], 7)
    assert count_macs(net, shape) == flop_counter_macs(net, shape) > 0


@pytest.mark.parametrize(("arch", "width"), EVERY_ANCHOR)
def test_stem_takes_the_datas_channels_at_stride_one(arch: str, width: float) -> None:
    net = AnchorNet(arch, width, 1, 5)
    stem = next(m for m in net.modules() if isinstance(m, torch.nn.Conv2d))
    assert stem.in_channels == 1 and stem.stride == (1, 1)
    features, logits = net(torch.randn(2, 1, 28, 28), NO_ARCH)
    assert logits.shape == (2, 5) and features is logits
    assert net.name == anchor_name(arch, width) and net.default_arch() == NO_ARCH


def test_a_wider_anchor_costs_more() -> None:
    for arch, widths in WIDTHS.items():
        costs = [count_macs(AnchorNet(arch, w, 3, 10), (3, 32, 32)) for w in sorted(widths)]
        assert costs == sorted(costs) and len(set(costs)) == len(costs), arch


def test_bad_anchors_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown anchor 'vgg'"):
        AnchorNet("vgg", 1.0, 3, 10)
    with pytest.raises(ValueError, match="shufflenet_v2 widths"):
        AnchorNet("shufflenet_v2", 0.75, 3, 10)
    with pytest.raises(ValueError, match="resnet18 width"):
        AnchorNet("resnet18", 2.5, 3, 10)
    with pytest.raises(ValueError, match="width must be > 0"):
        AnchorNet("mnasnet", 0, 3, 10)


@pytest.mark.parametrize(("arch", "width"), [(a, w) for a, ws in WIDTHS.items() for w in ws])
def test_every_anchors_batchnorm_statistics_follow_a_short_run(arch: str, width: float) -> None:
    """At this project's step budgets (thousands of steps) running statistics must follow the weights: a
    momentum of 0.01 (MobileNetV3's own) averages over about 100 steps; MNASNet's TensorFlow decay
    (momentum 0.0003, over about 3,000) would leave them near their initial values."""
    net = AnchorNet(arch, width, 1, 10)
    assert min(m.momentum for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)) >= 0.01
