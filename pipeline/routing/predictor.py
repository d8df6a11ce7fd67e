"""Per-image subnetwork predictor of a supernet module (claim 7): a tiny net on the incoming features.

It must cost far less than what it saves (design: at most 5% of the module's cheapest candidate),
so it is pooling plus a two-layer MLP; ``predictor_macs`` prices it with the same counter as the
modules so the engine's per-image cost includes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.models.cost import count_macs


class Predictor(nn.Module):
    """Adaptive average pool to ``pool x pool`` + Linear + ReLU + Linear -> logits over R candidates.

    Weights are drawn from ``seed`` without touching the caller's global RNG state.
    """

    def __init__(
        self, in_channels: int, num_candidates: int, hidden: int = 16, pool: int = 1, seed: int = 0
    ) -> None:
        super().__init__()
        for name, value, least in (
            ("in_channels", in_channels, 1),
            ("num_candidates", num_candidates, 2),
            ("hidden", hidden, 1),
            ("pool", pool, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"Predictor.{name} must be an int >= {least}, got {value!r}")
        self.in_channels = in_channels
        self.num_candidates = num_candidates
        self.hidden = hidden
        self.pool_size = pool
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.pool = nn.AdaptiveAvgPool2d(pool)
            self.fc1 = nn.Linear(in_channels * pool * pool, hidden)
            self.fc2 = nn.Linear(hidden, num_candidates)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        h = torch.flatten(self.pool(features), 1)  # (B, C * pool^2)
        return self.fc2(F.relu(self.fc1(h)))  # (B, R)

    def choose(self, features: torch.Tensor) -> torch.Tensor:
        """The candidate to run for each image: argmax of the logits -> (B,) long."""
        return self.forward(features).argmax(dim=1)  # (B,)


def predictor_macs(predictor: Predictor, input_shape: Sequence[int]) -> int:
    """MACs per image of the predictor on a (C, H, W) feature map (its two Linear layers)."""
    return count_macs(predictor, input_shape)


def class_weights(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Weights inverse to label frequency, mean 1 over the labels present (absent labels get 0).

    Without them a predictor can learn to always pick the commonest candidate (often the cheapest).
    """
    counts = torch.bincount(labels, minlength=num_classes).double()  # (R,)
    present = counts > 0
    weights = torch.zeros(num_classes, dtype=torch.float64, device=labels.device)
    weights[present] = counts.sum() / (present.sum() * counts[present])
    return weights.float()  # (R,)


def train_predictor(
    predictor: Predictor,
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    balanced: bool = False,
    weight_decay: float = 0.0,
) -> dict[str, list[float]]:
    """Fit the predictor in place on precomputed features (N, C, H, W) and labels (N,) with Adam.

    Cross-entropy, optionally weighted inverse to label frequency (``balanced``). Shuffling uses
    its own ``torch.Generator`` from ``seed``, so the same inputs give the same weights. Returns
    per-epoch ``loss`` (weighted mean) and ``accuracy`` (on the training data, in eval mode), plus
    ``label_share`` (the fraction of each label). The predictor is left in eval mode.
    """
    if features.dim() != 4 or labels.dim() != 1 or features.shape[0] != labels.shape[0]:
        raise ValueError(
            f"train_predictor needs features (N, C, H, W) and labels (N,), "
            f"got {tuple(features.shape)} and {tuple(labels.shape)}"
        )
    n, r = labels.shape[0], predictor.num_candidates
    if n == 0:
        raise ValueError("train_predictor needs at least one sample")
    if int(labels.min()) < 0 or int(labels.max()) >= r:
        raise ValueError(f"train_predictor: labels must lie in [0, {r}), got {labels.unique().tolist()}")
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1, lr > 0; got {epochs}, {batch_size}, {lr}")
    labels = labels.long().to(features.device)
    weight = class_weights(labels, r) if balanced else None
    optimizer = torch.optim.Adam(predictor.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    history: dict[str, list[float]] = {
        "loss": [],
        "accuracy": [],
        "label_share": (torch.bincount(labels, minlength=r).double() / n).tolist(),
    }
    for _ in range(epochs):
        predictor.train()
        order = torch.randperm(n, generator=generator).to(features.device)  # (N,)
        total, seen = 0.0, 0
        for start in range(0, n, batch_size):
            rows = order[start : start + batch_size]  # (b,)
            logits = predictor(features.index_select(0, rows))  # (b, R)
            loss = F.cross_entropy(logits, labels[rows], weight=weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * rows.numel()
            seen += rows.numel()
        predictor.eval()
        with torch.no_grad():
            accuracy = float((predictor.choose(features) == labels).double().mean())
        history["loss"].append(total / seen)
        history["accuracy"].append(accuracy)
    return history
