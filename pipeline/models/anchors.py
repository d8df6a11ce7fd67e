"""The field's small networks, as a practitioner would train them instead of the cascade: torchvision's
MobileNetV3-Small, ShuffleNetV2, MNASNet and a width-scaled ResNet-18, from scratch, with stems adapted to
28-64 px inputs (docs/RESULTS.md 'The field's small networks').

Stem rule, one for all (what CIFAR ports of these nets do): the stem's stride-2 convolution becomes
stride 1 and takes the data's C channels; every later stride is kept. ImageNet's total stride 32 becomes
16, so a 28 px image ends at 2x2 and a 64 px image at 4x4 before the global pool. The ResNet-18 is the
CIFAR one (a 3x3 stride-1 stem, no max pool: total stride 8) built from torchvision's ``BasicBlock`` with
stage widths w, 2w, 4w, 8w (the ImageNet net is w = 64).

An ``AnchorNet`` has a fixed cascade module's surface (``space``, ``default_arch()``, ``forward(x, arch) ->
(features, logits)``), so ``pipeline.train.loop.train_module`` trains it with plain cross-entropy exactly
as it trains the plain CNN baselines. Nothing follows an anchor: its features are its logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torchvision.models import mnasnet, mobilenetv3, resnet, shufflenetv2

from pipeline.models.modules import NO_ARCH
from pipeline.search.space import Arch, SearchSpace

# ShuffleNetV2's per-width stage channels (torchvision's x0_5 and x1_0 builders use these).
SHUFFLE_CHANNELS = {0.5: [24, 48, 96, 192, 1024], 1.0: [24, 116, 232, 464, 1024]}


def _stem_conv(old: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    """``old`` with stride 1 and ``in_channels`` inputs (same kernel, padding and output channels)."""
    return nn.Conv2d(in_channels, old.out_channels, old.kernel_size, stride=1, padding=old.padding,
                     bias=old.bias is not None)


def _mobilenet_v3_small(width: float, in_channels: int, num_classes: int) -> nn.Module:
    net = mobilenetv3.mobilenet_v3_small(width_mult=width, num_classes=num_classes)
    net.features[0][0] = _stem_conv(net.features[0][0], in_channels)
    return net


def _shufflenet_v2(width: float, in_channels: int, num_classes: int) -> nn.Module:
    if width not in SHUFFLE_CHANNELS:
        raise ValueError(f"shufflenet_v2 widths are {sorted(SHUFFLE_CHANNELS)}, got {width}")
    net = shufflenetv2.ShuffleNetV2([4, 8, 4], SHUFFLE_CHANNELS[width], num_classes=num_classes)
    net.conv1[0] = _stem_conv(net.conv1[0], in_channels)
    return net


def _mnasnet(width: float, in_channels: int, num_classes: int) -> nn.Module:
    net = mnasnet.MNASNet(width, num_classes=num_classes)
    net.layers[0] = _stem_conv(net.layers[0], in_channels)
    for bn in net.modules():
        if isinstance(bn, nn.BatchNorm2d):
            # torchvision keeps TensorFlow's 0.9997 decay (momentum 0.0003), made for runs of ~10^5 steps: at
            # the few thousand steps trained here the running statistics would stay near their initial
            # values and the net would be judged in eval mode on statistics it never had
            # (docs/RESULTS.md "The field's small networks"). PyTorch's default, as every other anchor has.
            bn.momentum = 0.1
    return net


class _CifarResNet18(nn.Module):
    """ResNet-18 of torchvision's ``BasicBlock`` with stage widths w, 2w, 4w, 8w, CIFAR stem."""

    def __init__(self, width: int, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        blocks: list[nn.Module] = []
        inplanes = width
        for stage, planes in enumerate((width, 2 * width, 4 * width, 8 * width)):
            for i in range(2):
                stride = 2 if stage > 0 and i == 0 else 1
                down = None
                if stride != 1 or inplanes != planes:
                    down = nn.Sequential(resnet.conv1x1(inplanes, planes, stride), nn.BatchNorm2d(planes))
                blocks.append(resnet.BasicBlock(inplanes, planes, stride, down))
                inplanes = planes
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def _resnet18(width: float, in_channels: int, num_classes: int) -> nn.Module:
    if width != int(width) or width < 1:
        raise ValueError(f"resnet18 width is the first stage's channels, an int >= 1, got {width}")
    return _CifarResNet18(int(width), in_channels, num_classes)


BUILDERS: dict[str, Callable[[float, int, int], nn.Module]] = {
    "mobilenet_v3_small": _mobilenet_v3_small,
    "shufflenet_v2": _shufflenet_v2,
    "mnasnet": _mnasnet,
    "resnet18": _resnet18,
}

# Two or more widths per anchor, so each has a curve (torchvision's width multipliers; channels for ResNet).
WIDTHS: dict[str, tuple[float, ...]] = {
    "mobilenet_v3_small": (0.5, 1.0),
    "shufflenet_v2": (0.5, 1.0),
    "mnasnet": (0.5, 1.0),
    "resnet18": (8, 16),
}


def anchor_name(arch: str, width: float) -> str:
    """``mobilenet_v3_small@0.5``: the name a bench row and a plot point carry."""
    return f"{arch}@{width:g}"


class AnchorNet(nn.Module):
    """One of the field's nets (``arch`` of ``BUILDERS`` at ``width``) with a fixed module's surface."""

    def __init__(self, arch: str, width: float, in_channels: int, num_classes: int) -> None:
        super().__init__()
        if arch not in BUILDERS:
            raise ValueError(f"unknown anchor {arch!r}; known: {sorted(BUILDERS)}")
        if not width > 0:
            raise ValueError(f"anchor width must be > 0, got {width!r}")
        self.arch, self.width = arch, float(width)
        self.in_channels, self.num_classes = in_channels, num_classes
        self.space = SearchSpace()  # no decisions: NO_ARCH is the only architecture
        self.net = BUILDERS[arch](width, in_channels, num_classes)

    @property
    def name(self) -> str:
        return anchor_name(self.arch, self.width)

    def default_arch(self) -> Arch:
        return NO_ARCH

    def forward(self, x: torch.Tensor, arch: Arch = NO_ARCH) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C, H, W) normalised images -> (logits, logits), each (B, num_classes)."""
        self.space.validate(arch)
        logits = self.net(x)
        return logits, logits
