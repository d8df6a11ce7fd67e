"""bench/ceiling.py's helpers (the probe itself is a script: `python -m bench.ceiling`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bench.ceiling import (
    Soft,
    Views,
    cosine_lr,
    distill_variants,
    fit_on_views,
    module_variants,
    scores,
    soft_loss,
)
from pipeline.models.modules import ModuleSpec, build_module


def test_scores_alone_and_in_the_exit_ensemble() -> None:
    labels = torch.tensor([0, 1])
    # The last exit is wrong on image 1; exit 1 is confidently right there, so the ensemble fixes it.
    last = torch.tensor([[3.0, 0.0], [0.2, 0.0]])
    first = torch.tensor([[3.0, 0.0], [0.0, 9.0]])
    row = scores(last, [first], labels, "calib")
    assert row["calib"] == 50.0
    assert row["calib ens 0.25"] == 100.0 and row["calib ens 0.5"] == 100.0
    # Weighted down enough, a mildly confident exit 1 no longer outvotes the last exit.
    assert scores(torch.tensor([[3.0, 0.0], [2.0, 0.0]]), [torch.tensor([[3.0, 0.0], [0.0, 2.0]])], labels,
                  "t")["t ens 0.25"] == 50.0


def test_cosine_lr_starts_at_base_and_ends_near_zero() -> None:
    assert cosine_lr(0.1, 0, 100) == pytest.approx(0.1)
    assert cosine_lr(0.1, 50, 100) == pytest.approx(0.05)
    assert cosine_lr(0.1, 100, 100) == pytest.approx(0.0, abs=1e-12)


def test_module_variants_are_fixed_modules_from_the_supernet_spec() -> None:
    spec = ModuleSpec(kind="supernet", channels=8, stride=2, layers=3, ops=("conv3", "skip"),
                      default_op="conv3")
    variants = module_variants(spec, 3)
    assert len(variants) == 5
    assert all(s.kind == "fixed" and not s.ops for s, _ in variants.values())
    assert sorted(e for _, e in variants.values()) == [3, 3, 3, 3, 6]
    assert {(s.channels, s.stride, s.layers) for s, _ in variants.values()} == {
        (8, 2, 0), (8, 2, 2), (16, 2, 1), (8, 1, 1)}


def test_fit_on_views_learns_a_separable_toy_problem_deterministically() -> None:
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 2, (256,), generator=g)
    x = torch.randn(256, 4, 6, 6, generator=g).abs() + labels[:, None, None, None] * 2.0
    views = Views(x.half(), x.flip(-1).half(), x[:64], x[:64])
    spec = ModuleSpec(kind="fixed", channels=4, stride=2, layers=0, head="gap")

    def trained() -> torch.nn.Module:
        torch.manual_seed(0)
        net = build_module(spec, 4, 2)
        fit_on_views(net, views, labels, epochs=3, shift=1, seed=0, batch=32)
        return net

    a, b = trained(), trained()
    with torch.no_grad():
        logits = a(x[:64], a.default_arch())[1]
    assert (logits.argmax(-1) == labels[:64]).float().mean() > 0.9
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    assert all(torch.equal(p, q) for p, q in pairs)


def test_soft_loss_mixes_cross_entropy_and_the_teacher() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.3, 0.1]])
    labels = torch.tensor([0, 2])
    ce = F.cross_entropy(logits, labels)
    assert torch.allclose(soft_loss(logits, labels, torch.randn(2, 3), 0.0, 4.0), ce)
    # A student that already answers as its teacher pays only the cross-entropy share.
    assert torch.allclose(soft_loss(logits, labels, logits.clone(), 0.5, 4.0), 0.5 * ce)
    # Against a different teacher the KL part is positive and grows with the weight.
    other = torch.tensor([[-1.0, 0.0, 2.0], [0.1, 0.3, 0.5]])
    assert soft_loss(logits, labels, other, 1.0, 4.0) > 0
    assert soft_loss(logits, labels, other, 0.9, 4.0) > soft_loss(logits, labels, other, 0.1, 4.0)


def _toy_problem() -> tuple[torch.Tensor, torch.Tensor]:
    """(labels (256,), images (256, 4, 6, 6)): two classes told apart by their mean level."""
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 2, (256,), generator=g)
    return labels, torch.randn(256, 4, 6, 6, generator=g).abs() + labels[:, None, None, None] * 2.0


def _distilled_confidence(teacher_plain: torch.Tensor, teacher_flipped: torch.Tensor) -> float:
    """Mean probability of the true label after full distillation (weight 1) from the given teacher
    logits on the two views; both views hold the same images, so only the teacher tells them apart."""
    labels, x = _toy_problem()
    views = Views(x.half(), x.half(), x[:64], x[:64])
    torch.manual_seed(0)
    net = build_module(ModuleSpec(kind="fixed", channels=4, stride=2, layers=0, head="gap"), 4, 2)
    fit_on_views(net, views, labels, epochs=6, shift=0, seed=0, batch=32,
                 soft=Soft(teacher_plain, teacher_flipped, weight=1.0, temperature=1.0))
    with torch.no_grad():
        probs = net(x, net.default_arch())[1].softmax(-1)
    return probs.gather(1, labels[:, None]).mean().item()


def test_distillation_follows_the_teacher_on_each_view() -> None:
    """Weight 1: the labels play no part, the student learns whatever the teacher says on the view it
    is shown (the plain view, or the mirrored one in half the steps)."""
    labels, _ = _toy_problem()
    right = F.one_hot(labels, 2).float() * 8.0  # (N, 2): confident and right
    wrong = right.flip(-1)  # confident and wrong
    assert [v is None for v in distill_variants((right, right)).values()] == [True, False, False]
    assert _distilled_confidence(right, right) > 0.9
    assert _distilled_confidence(wrong, wrong) < 0.1
    # right on one view, wrong on the other: the student hears both and stays undecided
    assert 0.25 < _distilled_confidence(right, wrong) < 0.75
    assert 0.25 < _distilled_confidence(wrong, right) < 0.75
