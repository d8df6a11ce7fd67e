"""What a supernet module's selection reads: its input features on a split (the frozen modules before it
applied to the images) and, per image, how each candidate path answers at its exit."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.device import autocast
from pipeline.search.space import Arch


@torch.inference_mode()
def candidate_outputs(module, features: torch.Tensor, labels: torch.Tensor, archs: list[Arch],
                      batch_size: int = 512) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per image and candidate: correct (N, R), p(true class) (N, R), CE (N, R), on the CPU whatever
    device ``module`` and ``features`` are on (logits in float32)."""
    correct, p_true, ce = [], [], []
    labels = labels.cpu()
    for arch in archs:
        logits = torch.cat([module(features[s:s + batch_size], arch)[1].float().cpu()
                            for s in range(0, len(labels), batch_size)])
        correct.append(logits.argmax(1) == labels)
        p_true.append(logits.softmax(1).gather(1, labels[:, None])[:, 0])
        ce.append(F.cross_entropy(logits, labels, reduction="none"))
    return torch.stack(correct, 1), torch.stack(p_true, 1), torch.stack(ce, 1)


def split_features(prefix, split, batch_size: int = 512, device: torch.device | None = None,
                   precision: str = "fp32") -> tuple[torch.Tensor, torch.Tensor]:
    """Module k's input (N, C, H, W) float32 on ``device`` (default: the CPU), labels (N,) on the CPU."""
    device = torch.device("cpu") if device is None else device
    with torch.inference_mode(), autocast(device, precision):
        pairs = [(prefix(x), y) for x, y in prefix.batches(split.images, split.labels, batch_size, device)]
    return torch.cat([p[0] for p in pairs]).float(), torch.cat([p[1] for p in pairs]).cpu()
