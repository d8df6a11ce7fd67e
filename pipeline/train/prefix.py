"""The frozen modules 1..k-1 as module k sees them: normalisation, then each on its selected path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.search.space import Arch
from pipeline.train.data import ImageBatches


def module_device(module: nn.Module) -> torch.device:
    param = next(module.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


@dataclass(frozen=True, eq=False)
class Prefix:
    """What turns a raw uint8 batch into module k's input: normalisation, then the frozen M1..M(k-1).

    The modules are done training: the prefix puts them in eval mode (BatchNorm uses, never updates,
    its running statistics) with ``requires_grad`` off, and runs them under ``torch.no_grad``.
    """

    stages: tuple[tuple[nn.Module, Arch], ...] = ()
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple((m, a) for m, a in self.stages))
        object.__setattr__(self, "mean", tuple(float(v) for v in np.atleast_1d(self.mean)))
        object.__setattr__(self, "std", tuple(float(v) for v in np.atleast_1d(self.std)))
        for module, _ in self.stages:
            module.eval().requires_grad_(False)

    def __contains__(self, module: nn.Module) -> bool:
        return any(module is m for m, _ in self.stages)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) normalised images -> (B, C_k, H_k, W_k) input of module k."""
        with torch.no_grad():
            for module, arch in self.stages:
                module.eval()  # again: a caller's .train() on a parent must not move BN statistics
                x, _ = module(x, arch)  # (B, C_j, H_j, W_j)
        return x

    def batches(self, images: np.ndarray, labels: np.ndarray, batch_size: int, device: torch.device,
                **augment: Any) -> ImageBatches:
        """Batches normalised the way this prefix expects."""
        return ImageBatches(images, labels, batch_size, mean=self.mean, std=self.std, device=device,
                            **augment)
