"""Tests of method B's probability model: MLE, entropy pick, sampling, MI loss, black-box search."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeline.search.picks import (
    choice_entropy,
    entropy_pick,
    final_pick,
    greedy_pick,
    pick_archs,
    plain_pick,
)
from pipeline.search.probmodel import ProbModel, gaussian_mi, mi_loss, mle_update, supernet_step_loss
from pipeline.search.space import Decision, SearchSpace
from pipeline.search.synthetic import make_synthetic

# Upper 0.1% points of the chi-square distribution (df -> critical value).
CHI2_CRIT_0001 = {3: 16.266, 11: 31.264}


@pytest.fixture
def small_space() -> SearchSpace:
    return SearchSpace((Decision("a", ("a0", "a1")), Decision("b", ("b0", "b1", "b2"))))


@pytest.fixture
def grid_space() -> SearchSpace:
    return SearchSpace(tuple(Decision(f"d{j}", tuple(f"c{c}" for c in range(5))) for j in range(6)))


def _arch(space: SearchSpace, a: str, b: str):
    return space.make({"a": a, "b": b})


# --- the model itself -----------------------------------------------------------------------------


def test_uniform_model_basics(small_space: SearchSpace) -> None:
    model = ProbModel.uniform(small_space)
    assert model.is_uniform()
    assert model.entropy() == pytest.approx(math.log(6))
    assert model.most_likely() == _arch(small_space, "a0", "b0")
    assert model.log_prob_vector().shape == (5,)
    assert ProbModel.from_dict(small_space, model.as_dict()).as_dict() == model.as_dict()


@pytest.mark.parametrize("probs", [[[0.5, 0.5]], [[0.5, 0.5], [0.5, 0.5]], [[0.5, 0.6], [0.2, 0.3, 0.5]],
                                   [[1.5, -0.5], [0.2, 0.3, 0.5]]])
def test_bad_probabilities_are_rejected(small_space: SearchSpace, probs: list[list[float]]) -> None:
    with pytest.raises(ValueError):
        ProbModel.from_probs(small_space, probs)


def test_sampling_follows_probabilities(small_space: SearchSpace) -> None:
    """Chi-square goodness of fit of the joint (a, b) counts to p_a * p_b."""
    pa, pb = np.array([0.7, 0.3]), np.array([0.5, 0.35, 0.15])
    model = ProbModel.from_probs(small_space, [pa.tolist(), pb.tolist()])
    n = 20_000
    counts = np.zeros((2, 3))
    for arch in model.sample(n, np.random.default_rng(0)):
        counts[small_space.index(arch)] += 1
    expected = n * np.outer(pa, pb)
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert statistic < CHI2_CRIT_0001[11]
    # and a badly wrong model is caught by the same statistic
    wrong = n * np.outer([0.6, 0.4], pb)
    assert float(((counts - wrong) ** 2 / wrong).sum()) > CHI2_CRIT_0001[11]


def test_sample_distinct_is_distinct_and_capped(small_space: SearchSpace) -> None:
    model = ProbModel.uniform(small_space)
    archs = model.sample_distinct(100, np.random.default_rng(1))
    assert len(archs) == len(set(archs)) == 6
    picked = final_pick(ProbModel.uniform(small_space), 4, np.random.default_rng(2))
    assert len(picked) == len(set(picked)) == 4


# --- MLE -------------------------------------------------------------------------------------------


def test_mle_equals_weighted_frequencies(small_space: SearchSpace) -> None:  # the softmax utility
    archs = [_arch(small_space, "a0", "b0"), _arch(small_space, "a1", "b1"), _arch(small_space, "a0", "b1")]
    perf = torch.tensor([0.0, math.log(2.0), 0.0], dtype=torch.float64)  # softmax -> (1/4, 1/2, 1/4)
    prev = ProbModel.uniform(small_space)

    raw = mle_update(prev, archs, perf, temperature=1.0, smoothing=0.0, step=1.0, utility="softmax")
    assert raw.probs("a").tolist() == pytest.approx([0.5, 0.5])
    assert raw.probs("b").tolist() == pytest.approx([0.25, 0.75, 0.0])

    # Laplace s = 0.5: (freq + 0.5) / (1 + 0.5 n); then half-way back to the uniform prev
    mixed = mle_update(prev, archs, perf, temperature=1.0, smoothing=0.5, step=0.5, utility="softmax")
    assert mixed.probs("a").tolist() == pytest.approx([0.5, 0.5])
    expected_b = [0.5 * 0.30 + 0.5 / 3, 0.5 * 0.50 + 0.5 / 3, 0.5 * 0.20 + 0.5 / 3]
    assert mixed.probs("b").tolist() == pytest.approx(expected_b)

    # temperature sharpens: at T -> 0 all the weight goes to the best arch
    sharp = mle_update(prev, archs, perf, temperature=1e-3, smoothing=0.0, step=1.0, utility="softmax")
    assert sharp.most_likely() == archs[1]


def test_mle_is_differentiable_in_perf(small_space: SearchSpace) -> None:
    archs = [_arch(small_space, "a0", "b0"), _arch(small_space, "a1", "b2")]
    perf = torch.tensor([0.1, 0.3], requires_grad=True)
    new = mle_update(ProbModel.uniform(small_space), archs, perf, 1.0, 0.1, 0.5, utility="softmax")
    new.probs("a")[1].backward()
    assert perf.grad is not None and float(perf.grad[1]) > 0 > float(perf.grad[0])


@pytest.mark.parametrize("kwargs", [dict(temperature=0.0), dict(smoothing=-1.0), dict(step=0.0),
                                    dict(step=1.5), dict(perf=torch.zeros(3))])
def test_mle_rejects_bad_input(small_space: SearchSpace, kwargs: dict) -> None:
    args = dict(prev=ProbModel.uniform(small_space), archs=[_arch(small_space, "a0", "b0")] * 2,
                perf=torch.zeros(2), temperature=1.0, smoothing=0.1, step=0.5)
    with pytest.raises(ValueError):
        mle_update(**{**args, **kwargs})


# --- entropy-maximising pick -----------------------------------------------------------------------


def test_greedy_pick_beats_plain_sampling(grid_space: SearchSpace) -> None:
    rng = np.random.default_rng(3)
    logits = [torch.as_tensor(rng.normal(size=5)) for _ in range(6)]
    for model in (ProbModel.uniform(grid_space), ProbModel.from_logits(grid_space, logits)):
        picked_h, plain_h = [], []
        for seed in range(20):
            picked = greedy_pick(model, 10, np.random.default_rng(seed))
            plain = plain_pick(model, 10, np.random.default_rng(seed))
            assert len(picked) == len(set(picked)) == 10 == len(plain)
            picked_h.append(choice_entropy(grid_space, picked))
            plain_h.append(choice_entropy(grid_space, plain))
        assert np.mean(picked_h) > np.mean(plain_h) + 0.5  # nats, summed over 6 decisions


@pytest.mark.parametrize("pick", [entropy_pick, greedy_pick])
def test_picks_on_a_small_space_return_what_exists(small_space: SearchSpace, pick) -> None:
    picked = pick(ProbModel.uniform(small_space), 10, np.random.default_rng(0))
    assert sorted(a.key() for a in picked) == sorted(a.key() for a in small_space.enumerate())
    # a perfectly balanced pick of 2 from the full space: both decisions split evenly
    two = pick(ProbModel.uniform(small_space), 2, np.random.default_rng(0))
    assert choice_entropy(small_space, two) == pytest.approx(2 * math.log(2))


def test_entropy_pick_is_the_most_even_pick_at_a_uniform_model(grid_space: SearchSpace) -> None:
    """At a uniform P every decision's histogram of 10 picks over 5 choices is 2/2/2/2/2: the
    maximum of the summed choice entropy, every time (the greedy pool and plain draws fall short)."""
    model = ProbModel.uniform(grid_space)
    for seed in range(10):
        picked = entropy_pick(model, 10, np.random.default_rng(seed))
        assert len(set(picked)) == 10
        assert choice_entropy(grid_space, picked) == pytest.approx(6 * math.log(5))
        assert choice_entropy(grid_space, plain_pick(model, 10, np.random.default_rng(seed))) < 6 * math.log(5)


def test_entropy_pick_follows_the_model_without_bias(grid_space: SearchSpace) -> None:
    """Each decision's histogram of m picks has floor or ceil of m P(c) of choice c, so the choice
    frequencies match P (no pull towards uniform, unlike the greedy pool), and are more even than
    plain draws of P."""
    rng = np.random.default_rng(11)
    model = ProbModel.from_logits(grid_space, [torch.as_tensor(2 * rng.normal(size=5)) for _ in range(6)])
    idx = model._stratified_index(16, np.random.default_rng(0))
    for j, p in enumerate(model.table):
        counts = np.bincount(idx[:, j], minlength=5)
        expected = 16 * p.numpy()
        assert np.all(counts >= np.floor(expected) - 1e-9) and np.all(counts <= np.ceil(expected) + 1e-9)
    freq = {k: np.zeros(5) for k in ("entropy", "greedy")}
    ent = {k: [] for k in ("entropy", "plain")}
    for seed in range(300):
        r = np.random.default_rng(seed)
        for k, archs in (("entropy", entropy_pick(model, 8, r)), ("greedy", greedy_pick(model, 8, r, 4))):
            freq[k] += np.bincount([grid_space.index(a)[0] for a in archs], minlength=5)
        for k, fn in (("entropy", entropy_pick), ("plain", plain_pick)):
            ent[k].append(choice_entropy(grid_space, fn(model, 8, np.random.default_rng(10_000 + seed))))
    p0 = model.table[0].numpy()
    err = {k: np.abs(f / f.sum() - p0).sum() for k, f in freq.items()}
    assert err["entropy"] < 0.05 < err["greedy"]
    assert np.mean(ent["entropy"]) > np.mean(ent["plain"])


def test_pick_archs_dispatches_and_rejects_unknown_rules(grid_space: SearchSpace) -> None:
    model = ProbModel.uniform(grid_space)
    for rule, fn in (("entropy", entropy_pick), ("plain", plain_pick)):
        assert pick_archs(model, 6, np.random.default_rng(1), rule) == fn(model, 6, np.random.default_rng(1))
    assert pick_archs(model, 6, np.random.default_rng(1), "greedy", 4) == greedy_pick(
        model, 6, np.random.default_rng(1), 4)
    with pytest.raises(ValueError, match="pick must be one of"):
        pick_archs(model, 6, np.random.default_rng(1), "best")


# --- mutual information ----------------------------------------------------------------------------


def test_gaussian_mi_matches_closed_form() -> None:
    rng = np.random.default_rng(4)
    n, rho = 200_000, 0.6
    x = rng.normal(size=n)
    y = rho * x + math.sqrt(1 - rho**2) * rng.normal(size=n)
    mi = gaussian_mi(torch.as_tensor(x), torch.as_tensor(3.0 * y + 1.0))
    assert mi is not None and mi.dim() == 0
    assert float(mi) == pytest.approx(-0.5 * math.log(1 - rho**2), abs=0.01)


def test_gaussian_mi_constant_and_identical_vectors() -> None:
    a = torch.tensor([0.1, 0.5, 0.2, 0.9])
    assert gaussian_mi(torch.full((4,), math.log(0.2)), a) is None
    assert gaussian_mi(a, torch.zeros(4)) is None
    assert float(gaussian_mi(a, a, eps=1e-6)) == pytest.approx(-0.5 * math.log(1e-6), rel=1e-3)
    with pytest.raises(ValueError):
        gaussian_mi(a, a[:3])


def _tiny_perf_net(space: SearchSpace, archs, seed: int) -> tuple[torch.nn.Linear, torch.Tensor]:
    """perf = a linear layer on each arch's one-hot encoding: stands in for -CE under shared weights."""
    gen = torch.Generator().manual_seed(seed)
    layer = torch.nn.Linear(sum(len(d.choices) for d in space.decisions), 1)
    with torch.no_grad():  # overwrite the default init, which draws from the global generator
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen))
        layer.bias.zero_()
    onehot = torch.zeros(len(archs), layer.in_features)
    for i, arch in enumerate(archs):
        offset = 0
        for d, c in zip(space.decisions, space.index(arch), strict=True):
            onehot[i, offset + c] = 1.0
            offset += len(d.choices)
    return layer, onehot


def test_mi_loss_puts_gradient_on_weights(grid_space: SearchSpace) -> None:
    rng = np.random.default_rng(5)
    prev = ProbModel.from_logits(grid_space, [torch.as_tensor(rng.normal(size=5)) for _ in range(6)])
    archs = entropy_pick(prev, 12, rng)
    layer, onehot = _tiny_perf_net(grid_space, archs, seed=0)
    kwargs = dict(temperature=0.5, smoothing=0.1, step=0.5, eps=1e-3, utility="softmax")

    perf = layer(onehot).squeeze(1)  # (m,)
    loss, new, info = supernet_step_loss(torch.zeros(len(archs)), perf, prev, archs, beta=1.0, **kwargs)
    loss.backward()
    grad = layer.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and float(grad.abs().sum()) > 0
    assert info["mi"] is not None and info["mi"] > 0
    assert loss.item() == pytest.approx(1.0 / (info["mi"] + 1e-3))
    assert not any(p.requires_grad for p in new.table)

    # a small gradient step on the weights raises the MI between P(i-1) and P(i)
    with torch.no_grad():
        layer.weight -= 1e-2 * grad
        layer.bias -= 1e-2 * layer.bias.grad
    _, _, after = supernet_step_loss(torch.zeros(len(archs)), layer(onehot).squeeze(1).detach(), prev, archs,
                                     beta=1.0, **kwargs)
    assert after["mi"] > info["mi"]


def test_mi_term_skipped_from_uniform_prior_or_beta_zero(grid_space: SearchSpace) -> None:
    rng = np.random.default_rng(6)
    uniform = ProbModel.uniform(grid_space)
    archs = entropy_pick(uniform, 8, rng)
    perf = torch.as_tensor(rng.normal(size=8), dtype=torch.float64)
    task = torch.full((8,), 2.0)
    loss, new, info = supernet_step_loss(task, perf, uniform, archs, temperature=1.0, smoothing=0.1,
                                         step=0.5, beta=1.0)
    assert info["mi"] is None and loss.item() == pytest.approx(2.0)
    assert mi_loss(uniform, new, beta=1.0) is None
    assert mi_loss(new, new, beta=0.0) is None
    loss0, _, info0 = supernet_step_loss(task, perf, new, archs, temperature=1.0, smoothing=0.1, step=0.5,
                                         beta=0.0)
    assert info0["mi"] is None and loss0.item() == pytest.approx(2.0)


def test_synthetic_objective_scores_and_optimum() -> None:
    obj = make_synthetic(np.random.default_rng(7))
    scores = obj.all_scores()
    assert scores.shape == (15625,)
    archs = list(obj.space.enumerate())
    for r in np.random.default_rng(0).choice(15625, 50, replace=False):
        assert obj(archs[r]) == pytest.approx(scores[r])
    assert obj(obj.optimum()) == pytest.approx(scores.max())
    top = obj.top_set(0.001)
    assert len(top) == 16 and obj.optimum() in top


def test_rank_utility_mi_loss_reaches_the_weights(grid_space: SearchSpace) -> None:
    """Under rank utilities the MI gradient flows through the standardised-perf surrogate."""
    rng = np.random.default_rng(5)
    prev = ProbModel.from_logits(grid_space, [torch.as_tensor(rng.normal(size=5)) for _ in range(6)])
    archs = entropy_pick(prev, 12, rng)
    layer, onehot = _tiny_perf_net(grid_space, archs, seed=0)
    loss, _, info = supernet_step_loss(torch.zeros(len(archs)), layer(onehot).squeeze(1), prev, archs,
                                       temperature=1.0, smoothing=0.1, step=0.5, beta=1.0, utility="rank")
    loss.backward()
    assert info["mi"] is not None and float(layer.weight.grad.abs().sum()) > 0
