"""bench/ceiling.py's helpers (the probe itself is a script: `python -m bench.ceiling`)."""

from __future__ import annotations

import pytest
import torch

from bench.ceiling import Views, cosine_lr, fit_on_views, module_variants, scores
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
