from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline.train.losses import cost_aware_loss


def batch(b: int = 8, k: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k, generator=gen, requires_grad=True)  # (B, K)
    targets = torch.randint(0, k, (b,), generator=gen)  # (B,)
    return logits, targets


def test_reduces_to_cross_entropy_with_nonzero_grad() -> None:
    logits, targets = batch()
    cost = torch.linspace(1.0, 10.0, 8)
    loss, parts = cost_aware_loss(logits, targets, cost, 10.0, 0.7, lam=0.0, mu=0.0)
    expected = F.cross_entropy(logits, targets)
    assert torch.allclose(loss, expected)
    assert parts["ce"] == pytest.approx(expected.item()) == parts["weighted_ce"]
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_float_cost_equals_constant_tensor() -> None:
    logits, targets = batch()
    a, _ = cost_aware_loss(logits, targets, 3.0, 10.0, 0.5, lam=1.0, mu=0.5)
    b, _ = cost_aware_loss(logits, targets, torch.full((8,), 3.0), 10.0, 0.5, lam=1.0, mu=0.5)
    assert torch.allclose(a, b)


def test_cheap_paths_weigh_more() -> None:
    logits, targets = batch()
    cheap, parts = cost_aware_loss(logits, targets, 0.0, 10.0, 0.0, lam=2.0, mu=0.0)
    dear, _ = cost_aware_loss(logits, targets, 10.0, 10.0, 0.0, lam=2.0, mu=0.0)
    assert torch.allclose(cheap, 3.0 * dear)
    assert parts["weighted_ce"] == pytest.approx(3.0 * parts["ce"])
    over, _ = cost_aware_loss(logits, targets, 25.0, 10.0, 0.0, lam=2.0, mu=0.0)
    assert torch.allclose(over, dear)  # cost above cost_max counts as cost_max


def test_bce_term_matches_reference_and_reaches_the_logits() -> None:
    logits, targets = batch()
    loss, parts = cost_aware_loss(logits, targets, 5.0, 10.0, 0.5, lam=0.0, mu=2.0)
    conf = torch.softmax(logits, -1).max(-1).values
    correct = (logits.argmax(-1) == targets).float()
    bce = F.binary_cross_entropy(conf, correct)
    assert parts["bce"] == pytest.approx(bce.item(), rel=1e-5)
    assert torch.allclose(loss, F.cross_entropy(logits, targets) + 2.0 * 0.5 * bce)
    (grad_full,) = torch.autograd.grad(loss, logits)
    (grad_ce,) = torch.autograd.grad(F.cross_entropy(logits, targets), logits)
    assert not torch.allclose(grad_full, grad_ce)


def test_no_saving_switches_bce_off() -> None:
    logits, targets = batch()
    a, _ = cost_aware_loss(logits, targets, 5.0, 10.0, 0.0, lam=0.0, mu=5.0)
    assert torch.allclose(a, F.cross_entropy(logits, targets))


def test_confident_saturated_logits_stay_finite() -> None:
    logits = torch.tensor([[100.0, -100.0], [-100.0, 100.0]], requires_grad=True)
    loss, _ = cost_aware_loss(logits, torch.tensor([0, 0]), 1.0, 1.0, 1.0, lam=1.0, mu=1.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()


@pytest.mark.parametrize(
    ("kwargs", "item"),
    [
        ({"cost_max": 0.0}, "cost_max"),
        ({"exit_saving": 1.5}, "exit_saving"),
        ({"lam": -1.0}, "lam"),
        ({"path_cost": torch.ones(3)}, "path_cost"),
    ],
)
def test_bad_arguments(kwargs: dict, item: str) -> None:
    logits, targets = batch()
    args = {"path_cost": 1.0, "cost_max": 10.0, "exit_saving": 0.5, "lam": 1.0, "mu": 1.0, **kwargs}
    with pytest.raises(ValueError, match=item):
        cost_aware_loss(logits, targets, **args)
