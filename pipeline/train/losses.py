"""The cost-aware supernet loss (DESIGN.md section 3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cost_aware_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    path_cost: torch.Tensor | float,
    cost_max: float,
    exit_saving: float,
    lam: float,
    mu: float,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean over the batch of ``(1 + lam (1 - c_i/c_max)) CE_i + mu s BCE(conf_i, [argmax z_i == y_i])``.

    The first term weighs samples that ran through cheap paths more (those paths will serve the
    easy images); the second teaches the exit to be confident exactly when it is right. Costs above
    ``cost_max`` count as ``cost_max``, so the weight stays in ``[1, 1 + lam]``.
    """
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        shapes = f"{tuple(logits.shape)}, {tuple(targets.shape)}"
        raise ValueError(f"need logits (B, K) and targets (B,), got {shapes}")
    if cost_max <= 0:
        raise ValueError(f"cost_max must be > 0, got {cost_max}")
    if not 0.0 <= exit_saving <= 1.0:
        raise ValueError(f"exit_saving must be in [0, 1], got {exit_saving}")
    if lam < 0 or mu < 0:
        raise ValueError(f"lam and mu must be >= 0, got {lam}, {mu}")
    if not 0.0 < eps < 0.5:
        raise ValueError(f"eps must be in (0, 0.5), got {eps}")
    batch = logits.shape[0]
    cost = torch.as_tensor(path_cost, dtype=logits.dtype, device=logits.device).detach()
    if cost.ndim > 1 or (cost.ndim == 1 and cost.shape[0] != batch):
        raise ValueError(f"path_cost must be a float or a (B,) = ({batch},) tensor, got {tuple(cost.shape)}")

    ce = F.cross_entropy(logits, targets, reduction="none")  # (B,)
    weight = 1.0 + lam * (1.0 - (cost / cost_max).clamp(0.0, 1.0))  # (B,) or ()
    weighted_ce = weight * ce  # (B,)

    log_probs = F.log_softmax(logits, dim=-1)  # (B, K)
    conf = log_probs.max(dim=-1).values.exp().clamp(eps, 1.0 - eps)  # (B,) gradient flows through conf
    correct = (logits.argmax(dim=-1) == targets).to(logits.dtype).detach()  # (B,) 0/1 target
    # Written out rather than F.binary_cross_entropy, which refuses to run under CUDA autocast.
    bce = -(correct * conf.log() + (1.0 - correct) * (-conf).log1p())  # (B,)

    loss = (weighted_ce + mu * exit_saving * bce).mean()
    parts = {
        "ce": ce.mean().item(),
        "weighted_ce": weighted_ce.mean().item(),
        "bce": bce.mean().item(),
    }
    return loss, parts
