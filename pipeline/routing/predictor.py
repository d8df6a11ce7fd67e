"""Per-image subnetwork predictor of a supernet module (docs/BRIEF.md section 2.A): a tiny net on the incoming features.

It must cost far less than what it saves (design: at most 5% of the module's cheapest candidate),
so it is pooling plus a two-layer MLP; ``predictor_macs`` prices it with the same counter as the
modules so the engine's per-image cost includes it.

Two ways to score candidates (``scoring``):

- ``label``: logits over R candidates, trained with cross-entropy on one label per image (the
  cheapest candidate that answers right); it runs the argmax.
- ``p_right``: one logit per candidate for "this candidate's answer is right", trained with binary
  cross-entropy on every candidate's correctness; it runs the candidate with the highest
  ``sigmoid(logit) + offset``, where ``offsets[r] = -price * macs[r] / max(macs)`` is a cost price
  fitted after training (``priced_offsets``), so one trained net traces a whole accuracy-cost curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.models.cost import count_macs
from pipeline.params.choices import SELECT_SCORINGS

SCORINGS = SELECT_SCORINGS


class Predictor(nn.Module):
    """Adaptive average pool to ``pool x pool`` + Linear + ReLU + Linear -> logits over R candidates.

    Weights are drawn from ``seed`` without touching the caller's global RNG state.
    """

    def __init__(
        self, in_channels: int, num_candidates: int, hidden: int = 16, pool: int = 1, seed: int = 0,
        scoring: str = "label", offsets: Sequence[float] | None = None,
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
        if scoring not in SCORINGS:
            raise ValueError(f"Predictor.scoring must be one of {SCORINGS}, got {scoring!r}")
        offsets = [0.0] * num_candidates if offsets is None else [float(o) for o in offsets]
        if len(offsets) != num_candidates or not all(math.isfinite(o) for o in offsets):
            raise ValueError(f"Predictor.offsets needs {num_candidates} finite numbers, got {offsets!r}")
        if scoring == "label" and any(offsets):
            raise ValueError("Predictor.offsets are a cost price for scoring 'p_right'; 'label' takes none")
        self.in_channels = in_channels
        self.num_candidates = num_candidates
        self.scoring = scoring
        # Not in the state dict: the offsets live in the model's manifest beside the other settings.
        self.register_buffer("offsets", torch.tensor(offsets, dtype=torch.float32), persistent=False)
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
        """The candidate to run for each image -> (B,) long: the argmax of the logits (``label``) or
        of ``sigmoid(logits) + offsets`` (``p_right``)."""
        logits = self.forward(features)  # (B, R)
        if self.scoring == "label":
            return logits.argmax(dim=1)  # (B,)
        return (torch.sigmoid(logits.float()) + self.offsets).argmax(dim=1)  # (B,)

    def with_offsets(self, offsets: Sequence[float]) -> Predictor:
        """This ``p_right`` predictor with another cost price (in place; returns self)."""
        if self.scoring != "p_right":
            raise ValueError("with_offsets: only a 'p_right' predictor takes a cost price")
        if len(offsets) != self.num_candidates:
            raise ValueError(f"with_offsets needs {self.num_candidates} offsets, got {len(offsets)}")
        self.offsets.copy_(torch.tensor([float(o) for o in offsets], dtype=torch.float32))
        return self


def priced_offsets(price: float, macs: Sequence[float]) -> list[float]:
    """Offsets of a ``p_right`` predictor for a cost price: ``-price * macs[r] / max(macs)`` (R,).

    ``price`` is in probability-of-right per the costliest candidate's MACs: at price 0.1 a candidate
    must be 10 points likelier to be right per full cost of the largest one to be chosen."""
    if not math.isfinite(price) or price < 0:
        raise ValueError(f"priced_offsets: price must be a finite number >= 0, got {price!r}")
    top = max(float(m) for m in macs)
    if top <= 0:
        raise ValueError(f"priced_offsets needs some candidate with MACs > 0, got {list(macs)}")
    return [-price * float(m) / top for m in macs]


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


def _check_training(name: str, predictor: Predictor, scoring: str, features: torch.Tensor,
                    targets: torch.Tensor, target_shape: str, epochs: int, batch_size: int, lr: float) -> None:
    """The checks both trainers share: shapes (targets with 1 or 2 dims as ``target_shape`` says), the
    predictor's scoring, a non-empty set and sane settings."""
    dims = 1 if target_shape == "(N,)" else 2
    if features.dim() != 4 or targets.dim() != dims or features.shape[0] != targets.shape[0]:
        what = "labels" if dims == 1 else "correct"
        raise ValueError(f"{name} needs features (N, C, H, W) and {what} {target_shape}, "
                         f"got {tuple(features.shape)} and {tuple(targets.shape)}")
    if predictor.scoring != scoring:
        raise ValueError(f"{name} fits a {scoring!r} predictor; this one scores {predictor.scoring!r}")
    if targets.shape[0] == 0:
        raise ValueError("train_predictor needs at least one sample")
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1, lr > 0; got {epochs}, {batch_size}, {lr}")


def _fit(predictor: Predictor, features: torch.Tensor,
         loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], accuracy_of: Callable[[], float],
         history: dict[str, list[float]], *, epochs: int, lr: float,
         batch_size: int, seed: int, weight_decay: float) -> dict[str, list[float]]:
    """Adam over shuffled mini-batches of precomputed features; ``loss_of(logits, rows)``."""
    n = features.shape[0]
    optimizer = torch.optim.Adam(predictor.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        predictor.train()
        order = torch.randperm(n, generator=generator).to(features.device)  # (N,)
        total, seen = 0.0, 0
        for start in range(0, n, batch_size):
            rows = order[start : start + batch_size]  # (b,)
            loss = loss_of(predictor(features.index_select(0, rows)), rows)  # logits (b, R)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * rows.numel()
            seen += rows.numel()
        predictor.eval()
        with torch.no_grad():
            history["accuracy"].append(accuracy_of())
        history["loss"].append(total / seen)
    return history


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
    """Fit a ``label`` predictor in place on precomputed features (N, C, H, W) and labels (N,) with Adam.

    Cross-entropy, optionally weighted inverse to label frequency (``balanced``). Shuffling uses
    its own ``torch.Generator`` from ``seed``, so the same inputs give the same weights. Returns
    per-epoch ``loss`` (weighted mean) and ``accuracy`` (on the training data, in eval mode), plus
    ``label_share`` (the fraction of each label). The predictor is left in eval mode.
    """
    _check_training("train_predictor", predictor, "label", features, labels, "(N,)", epochs, batch_size, lr)
    n, r = labels.shape[0], predictor.num_candidates
    if int(labels.min()) < 0 or int(labels.max()) >= r:
        raise ValueError(f"train_predictor: labels must lie in [0, {r}), got {labels.unique().tolist()}")
    labels = labels.long().to(features.device)
    weight = class_weights(labels, r) if balanced else None
    history: dict[str, list[float]] = {
        "loss": [],
        "accuracy": [],
        "label_share": (torch.bincount(labels, minlength=r).double() / n).tolist(),
    }
    return _fit(predictor, features,
                lambda logits, rows: F.cross_entropy(logits, labels[rows], weight=weight),
                lambda: float((predictor.choose(features) == labels).double().mean()), history,
                epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, weight_decay=weight_decay)


def train_p_right(
    predictor: Predictor,
    features: torch.Tensor,
    correct: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    weight_decay: float = 0.0,
) -> dict[str, list[float]]:
    """Fit a ``p_right`` predictor in place: binary cross-entropy of each candidate's logit against
    whether that candidate's answer is right, ``correct`` (N, R). History as ``train_predictor``'s,
    with ``accuracy`` the share of (image, candidate) pairs whose right/wrong it calls, and
    ``label_share`` each candidate's share of right answers."""
    _check_training("train_p_right", predictor, "p_right", features, correct, "(N, R)", epochs, batch_size, lr)
    if correct.shape[1] != predictor.num_candidates:
        raise ValueError(f"train_p_right: {correct.shape[1]} candidates in correct, predictor has "
                         f"{predictor.num_candidates}")
    target = correct.float().to(features.device)  # (N, R)
    history: dict[str, list[float]] = {"loss": [], "accuracy": [], "label_share": target.mean(0).tolist()}
    return _fit(predictor, features,
                lambda logits, rows: F.binary_cross_entropy_with_logits(logits.float(), target[rows]),
                lambda: float(((predictor(features) > 0).float() == target).double().mean()), history,
                epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, weight_decay=weight_decay)
