"""bench/archive/ceiling.py's helpers (the probe itself is a script: `python -m bench.archive.ceiling`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bench.archive.ceiling
from bench.archive.ceiling import (
    Soft,
    Views,
    distill_variants,
    fit_on_views,
    module_variants,
    recipe,
    scores,
    step_loss,
)
from pipeline.models.modules import NO_ARCH, ModuleSpec, build_module
from pipeline.train.config import TrainConfig, learning_rate
from pipeline.train.loop import make_optimizer
from pipeline.train.steps import LossParams, StepNet, soft_target_loss


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


def test_the_recipe_is_the_benchs_documented_settings_as_a_train_config() -> None:
    cfg = recipe(3, seed=7)
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.momentum, cfg.weight_decay) == (3, 128, 0.1, 0.9, 5e-4)
    assert (cfg.schedule, cfg.warmup_epochs, cfg.seed) == ("cosine", 0.0, 7)
    assert (cfg.lam, cfg.mu, cfg.kd) == (0.0, 0.0, 0.0)  # plain cross-entropy
    distilled = recipe(3, 7, soft=Soft(torch.zeros(1, 2), torch.zeros(1, 2), kd=0.5, temperature=4.0))
    assert (distilled.kd, distilled.kd_temperature) == (0.5, 4.0)
    # the pipeline's schedule at these settings: cosine from 0.1 to 0 over the run
    assert learning_rate(cfg, 0, 100) == pytest.approx(0.1)
    assert learning_rate(cfg, 150, 100) == pytest.approx(0.05)
    assert learning_rate(cfg, 299, 100) == pytest.approx(0.0, abs=1e-4)


def test_fit_on_views_uses_the_pipelines_optimizer_and_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    """No weight decay on BatchNorm and biases (the pipeline's groups), and each step's lr from
    ``learning_rate``: the last step's lr is the schedule's at the last step."""
    made: list[tuple[TrainConfig, torch.optim.Optimizer]] = []

    def spy(module: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
        made.append((cfg, make_optimizer(module, cfg)))
        return made[-1][1]

    monkeypatch.setattr(bench.archive.ceiling, "make_optimizer", spy)
    labels, x = _toy_problem()
    views = Views(x.half(), x.flip(-1).half(), x[:64], x[:64])
    torch.manual_seed(0)
    net = build_module(ModuleSpec(kind="fixed", channels=4, stride=2, layers=0, head="gap"), 4, 2)
    fit_on_views(net, views, labels, epochs=2, shift=1, seed=0, batch=32)
    (cfg, opt), = made
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 5e-4 and no_decay["weight_decay"] == 0.0
    assert all(q.ndim > 1 for q in decay["params"]) and all(q.ndim == 1 for q in no_decay["params"])
    bn = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bn and all(any(q is m.weight for q in no_decay["params"]) for m in bn)
    assert all(g["nesterov"] and g["momentum"] == 0.9 for g in opt.param_groups)
    assert opt.param_groups[0]["lr"] == pytest.approx(learning_rate(cfg, 2 * 8 - 1, 8))


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


def test_step_loss_is_the_pipelines_step_loss_at_lam_and_mu_zero() -> None:
    """CE plus kd times the pipeline's soft-target term, exactly what the pipeline's training step
    (``StepNet`` on a fixed module, plain cross-entropy) computes from the same soft targets."""
    torch.manual_seed(0)
    net = build_module(ModuleSpec(kind="fixed", channels=4, stride=2, layers=0, head="gap"), 3, 3)
    x, labels = torch.randn(6, 3, 6, 6), torch.tensor([0, 2, 1, 1, 0, 2])
    soft = torch.softmax(torch.randn(6, 3) / 4.0, dim=-1)
    for kd, t in ((0.0, 1.0), (0.5, 4.0), (0.9, 2.0)):
        cfg = recipe(1, 0, soft=Soft(torch.zeros(6, 3), torch.zeros(6, 3), kd=kd, temperature=t))
        params = LossParams(lambda _arch: 1.0, 1.0, 0.0, cfg.lam, cfg.mu, cfg.label_smoothing, cfg.lambda_c,
                            kd=cfg.kd, kd_temperature=cfg.kd_temperature)
        pipeline = StepNet(net, cfg, params, np.random.default_rng(0))(x, labels, None, soft).loss
        logits = net(x, NO_ARCH)[1]
        ours = step_loss(logits, labels, cfg, soft)
        assert torch.allclose(ours, pipeline, rtol=1e-6, atol=1e-7)
        assert torch.allclose(ours, F.cross_entropy(logits, labels) + kd * soft_target_loss(logits, soft, t))
    assert torch.equal(step_loss(logits, labels, recipe(1, 0)), F.cross_entropy(logits, labels))


def _toy_problem() -> tuple[torch.Tensor, torch.Tensor]:
    """(labels (256,), images (256, 4, 6, 6)): two classes told apart by their mean level."""
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 2, (256,), generator=g)
    return labels, torch.randn(256, 4, 6, 6, generator=g).abs() + labels[:, None, None, None] * 2.0


def _distilled_confidence(teacher_plain: torch.Tensor, teacher_flipped: torch.Tensor) -> float:
    """Mean probability of the true label after distillation with kd 4 (CE + 4 KL: the teacher
    outweighs the labels) from the given teacher logits on the two views; both views hold the same
    images, so only the teacher tells them apart."""
    labels, x = _toy_problem()
    views = Views(x.half(), x.half(), x[:64], x[:64])
    torch.manual_seed(0)
    net = build_module(ModuleSpec(kind="fixed", channels=4, stride=2, layers=0, head="gap"), 4, 2)
    fit_on_views(net, views, labels, epochs=6, shift=0, seed=0, batch=32,
                 soft=Soft(teacher_plain, teacher_flipped, kd=4.0, temperature=1.0))
    with torch.no_grad():
        probs = net(x, net.default_arch())[1].softmax(-1)
    return probs.gather(1, labels[:, None]).mean().item()


def test_distillation_follows_the_teacher_on_each_view() -> None:
    """CE + kd KL at kd 4 (T 1): the student's probability of the true label settles where the two
    terms balance, p = (1 + kd t) / (1 + kd) for a teacher that gives it t, on the view it is shown
    (the plain view, or the mirrored one in half the steps)."""
    labels, _ = _toy_problem()
    right = F.one_hot(labels, 2).float() * 8.0  # (N, 2): confident and right
    wrong = right.flip(-1)  # confident and wrong
    assert [v is None for v in distill_variants((right, right)).values()] == [True, False, False]
    assert _distilled_confidence(right, right) > 0.9
    assert _distilled_confidence(wrong, wrong) == pytest.approx(0.2, abs=0.05)  # t = 0: against the labels
    # right on one view, wrong on the other: the student hears both (t = 1/2 on average: p = 0.6)
    assert 0.45 < _distilled_confidence(right, wrong) < 0.75
    assert 0.45 < _distilled_confidence(wrong, right) < 0.75
