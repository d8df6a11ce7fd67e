"""Candidate ops of a searchable layer: every op maps (B, C, H, W) -> (B, C, H, W) with stride 1."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType

import torch
from torch import nn


class ConvBNReLU(nn.Sequential):
    """Conv (no bias, BN follows) + BatchNorm + optional ReLU; padding keeps H, W at stride 1."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel: int,
        stride: int = 1,
        groups: int = 1,
        relu: bool = True,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, out_channels, kernel, stride, kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(out_channels),
        ]
        if relu:
            layers.append(nn.ReLU(inplace=True))
        super().__init__(*layers)


class DepthwiseSeparable(nn.Sequential):
    """Depthwise k x k then pointwise 1 x 1: a cheap stand-in for a full k x k conv."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__(
            ConvBNReLU(channels, channels, kernel, groups=channels),
            ConvBNReLU(channels, channels, 1),
        )


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand by ``expansion``, depthwise k x k, linear 1x1 project, + input."""

    def __init__(self, channels: int, kernel: int, expansion: int) -> None:
        super().__init__()
        hidden = channels * expansion
        self.body = nn.Sequential(
            ConvBNReLU(channels, hidden, 1),
            ConvBNReLU(hidden, hidden, kernel, groups=hidden),
            ConvBNReLU(hidden, channels, 1, relu=False),  # linear bottleneck, as in MobileNetV2
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)  # (B, C, H, W)


def _plain_conv(channels: int, kernel: int) -> nn.Module:
    return ConvBNReLU(channels, channels, kernel)


def _identity(channels: int) -> nn.Module:
    del channels  # same factory signature as the other ops
    return nn.Identity()


OPS: Mapping[str, Callable[[int], nn.Module]] = MappingProxyType(
    {
        "conv3": partial(_plain_conv, kernel=3),
        "conv5": partial(_plain_conv, kernel=5),
        "dw3": partial(DepthwiseSeparable, kernel=3),
        "dw5": partial(DepthwiseSeparable, kernel=5),
        "ir3_e3": partial(InvertedResidual, kernel=3, expansion=3),
        "ir3_e6": partial(InvertedResidual, kernel=3, expansion=6),
        "ir5_e3": partial(InvertedResidual, kernel=5, expansion=3),
        "ir5_e6": partial(InvertedResidual, kernel=5, expansion=6),
        "skip": _identity,
    }
)
"""Op name -> factory(channels). Read-only, so no code can register ops behind another's back."""


def make_op(name: str, channels: int) -> nn.Module:
    """Build a fresh op; unknown names fail loudly with the list of known ones."""
    if name not in OPS:
        raise ValueError(f"unknown op {name!r}; known ops: {sorted(OPS)}")
    if channels < 1:
        raise ValueError(f"op {name!r} needs channels >= 1, got {channels}")
    return OPS[name](channels)
