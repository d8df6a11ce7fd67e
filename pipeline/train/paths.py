"""One path of a trained module: its outputs behind the prefix, its BatchNorm statistics re-estimated
for that path, and its accuracy."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.models.modules import confidence, eval_mode
from pipeline.search.space import Arch
from pipeline.train.prefix import Prefix, module_device


def module_outputs(module: nn.Module, prefix: Prefix, images: np.ndarray, arch: Arch, batch_size: int,
                   *, features: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exit logits (N, K) of one path on CPU, and its feature maps (N, C, H, W) only if asked (big)."""
    device = module_device(module)
    data = prefix.batches(images, np.zeros(len(images), dtype=np.int64), batch_size, device)
    logits, maps = [], []
    with eval_mode(module), torch.no_grad():
        for x, _ in data:
            h, z = module(prefix(x), arch)  # (B, C, H, W), (B, K)
            logits.append(z.cpu())
            if features:
                maps.append(h.cpu())
    return torch.cat(logits), (torch.cat(maps) if features else None)


def recalibrate_batchnorm(module: nn.Module, prefix: Prefix, images: np.ndarray, arch: Arch,
                          batch_size: int = 256) -> None:
    """Re-estimate the running statistics of the BatchNorm layers that ``arch`` runs, from ``images``
    seen through ``prefix`` (plain averages over the batches, no momentum); weights stay as they are.

    A supernet's shared BatchNorm statistics average over every path trained; a single path's own
    statistics fit it better. Only the layers the path runs are touched (a forward of ``arch`` never
    reaches the others)."""
    device = module_device(module)
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m, m.momentum) for m in norms]
    touched = []
    hooks = [m.register_forward_pre_hook(lambda m, _inputs: touched.append(m)) for m in norms]
    try:
        with eval_mode(module), torch.no_grad():
            # First pass: which BatchNorms does this path run? Reset only those.
            probe, _ = next(iter(prefix.batches(images[:2], np.zeros(2, dtype=np.int64), 2, device)))
            module(prefix(probe), arch)
    finally:
        for hook in hooks:
            hook.remove()
    used = {id(m): m for m in touched}.values()
    for m in used:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average: every batch counts the same
    data = prefix.batches(images, np.zeros(len(images), dtype=np.int64), batch_size, device)
    flags = [(m, m.training) for m in module.modules()]
    try:
        module.eval()
        for m in used:
            m.train()
        with torch.no_grad():
            for x, _ in data:
                module(prefix(x), arch)
    finally:
        for m, training in flags:
            m.training = training
        for m, momentum in saved:
            m.momentum = momentum


def evaluate_path(module: nn.Module, prefix: Prefix, images: np.ndarray, labels: np.ndarray, arch: Arch,
                  batch_size: int) -> dict[str, float]:
    """Accuracy, mean CE and mean confidence of one path's exit, without augmentation."""
    logits, _ = module_outputs(module, prefix, images, arch, batch_size)  # (N, K)
    y = torch.as_tensor(np.asarray(labels, dtype=np.int64))  # (N,)
    return {
        "acc": float((logits.argmax(dim=-1) == y).double().mean()),
        "ce": float(F.cross_entropy(logits.double(), y)),
        "conf_mean": float(confidence(logits).double().mean()),
    }
