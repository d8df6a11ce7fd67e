from __future__ import annotations

import pytest
import torch

from pipeline.routing.predictor import (
    Predictor,
    class_weights,
    predictor_macs,
    priced_offsets,
    train_p_right,
    train_predictor,
)


def separable(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Label r <=> channel r is the brightest: a task a pooled linear model can learn."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=g)  # (N,)
    features = torch.rand(n, 4, 5, 5, generator=g)  # (N, 4, 5, 5)
    features[torch.arange(n), labels] += 1.0
    return features, labels


@pytest.mark.parametrize("pool", [1, 2])
def test_predictor_shapes_and_macs(pool: int) -> None:
    predictor = Predictor(6, 3, hidden=10, pool=pool)
    x = torch.randn(5, 6, 7, 7)  # (B, C, H, W)
    assert predictor(x).shape == (5, 3)
    choice = predictor.choose(x)
    assert choice.shape == (5,) and choice.dtype == torch.long
    assert int(choice.min()) >= 0 and int(choice.max()) < 3
    assert predictor_macs(predictor, (6, 7, 7)) == 6 * pool * pool * 10 + 10 * 3


def test_predictor_init_is_seeded_and_leaves_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    a, b = Predictor(4, 3, seed=1), Predictor(4, 3, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(Predictor(4, 3, seed=2).fc1.weight, a.fc1.weight)


def test_predictor_rejects_a_single_candidate() -> None:
    with pytest.raises(ValueError, match="num_candidates"):
        Predictor(4, 1)


def test_train_predictor_learns_and_is_deterministic() -> None:
    features, labels = separable(200, seed=0)
    runs = []
    for _ in range(2):
        predictor = Predictor(4, 3, hidden=16, seed=0)
        history = train_predictor(predictor, features, labels, epochs=15, lr=0.05, batch_size=50, seed=5)
        runs.append((predictor, history))
    (first, history), (second, history2) = runs
    assert history == history2
    assert all(torch.equal(p, q) for p, q in zip(first.parameters(), second.parameters(), strict=True))
    assert len(history["loss"]) == 15 and history["loss"][-1] < history["loss"][0]
    assert history["accuracy"][-1] > 0.9
    assert not first.training


def test_class_weights_are_inverse_to_frequency() -> None:
    weights = class_weights(torch.tensor([0, 0, 0, 1, 2, 2]), 4)
    assert torch.allclose(weights, torch.tensor([6 / 9, 6 / 3, 6 / 6, 0.0]))


def test_balanced_training_runs() -> None:
    features, labels = separable(60, seed=1)
    history = train_predictor(
        Predictor(4, 3), features, labels, epochs=2, lr=0.01, batch_size=16, seed=0, balanced=True
    )
    assert len(history["loss"]) == 2 and sum(history["label_share"]) == pytest.approx(1.0)


def test_train_predictor_rejects_bad_labels() -> None:
    features, _ = separable(10, seed=0)
    kwargs = {"epochs": 1, "lr": 0.1, "batch_size": 4, "seed": 0}
    with pytest.raises(ValueError, match="labels"):
        train_predictor(Predictor(4, 3), features, torch.full((10,), 3), **kwargs)
    with pytest.raises(ValueError, match=r"\(N,\)"):
        train_predictor(Predictor(4, 3), features, torch.zeros(9, dtype=torch.long), **kwargs)


def test_p_right_predictor_learns_which_candidate_is_right_and_prices_cost() -> None:
    features, labels = separable(300, seed=2)
    correct = torch.nn.functional.one_hot(labels, 3).bool()  # (N, 3): only candidate `label` is right
    predictor = Predictor(4, 3, hidden=16, seed=0, scoring="p_right")
    history = train_p_right(predictor, features, correct, epochs=20, lr=0.05, batch_size=50, seed=1)
    assert history["loss"][-1] < history["loss"][0] and history["accuracy"][-1] > 0.9
    assert history["label_share"] == pytest.approx(correct.float().mean(0).tolist())
    assert float((predictor.choose(features) == labels).float().mean()) > 0.9  # price 0: the likeliest
    macs = [1.0, 2.0, 10.0]
    predictor.with_offsets(priced_offsets(20.0, macs))  # a price no p(right) gap outweighs: the cheapest
    assert torch.equal(predictor.choose(features), torch.zeros(300, dtype=torch.long))
    assert priced_offsets(0.5, macs) == pytest.approx([-0.05, -0.1, -0.5])


def test_p_right_choice_follows_the_price_monotonically() -> None:
    features, labels = separable(200, seed=3)
    correct = torch.stack([labels == 0, labels != 2, torch.ones_like(labels, dtype=torch.bool)], 1)
    predictor = Predictor(4, 3, hidden=16, seed=0, scoring="p_right")
    train_p_right(predictor, features, correct, epochs=20, lr=0.05, batch_size=50, seed=1)
    macs = [1.0, 2.0, 4.0]
    spent = [float(torch.tensor(macs)[predictor.with_offsets(priced_offsets(p, macs)).choose(features)].mean())
             for p in (0.0, 0.05, 0.3, 1.0, 10.0)]
    assert spent == sorted(spent, reverse=True) and spent[0] > spent[-1] == 1.0


def test_predictor_scoring_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="scoring"):
        Predictor(4, 3, scoring="cost")
    with pytest.raises(ValueError, match="offsets"):
        Predictor(4, 3, scoring="p_right", offsets=[0.0, 1.0])
    with pytest.raises(ValueError, match="offsets"):
        Predictor(4, 3, scoring="p_right", offsets=[0.0, float("nan"), 1.0])
    with pytest.raises(ValueError, match="label"):
        Predictor(4, 3, offsets=[0.0, -0.1, -0.2])
    with pytest.raises(ValueError, match="p_right"):
        Predictor(4, 3).with_offsets([0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="p_right"):
        train_p_right(Predictor(4, 3), torch.zeros(4, 4, 2, 2), torch.zeros(4, 3), epochs=1, lr=0.1,
                      batch_size=2, seed=0)
    with pytest.raises(ValueError, match="price"):
        priced_offsets(-1.0, [1.0, 2.0])
    # A 'label' predictor keeps its argmax: offsets stay zero and never enter its choice.
    assert torch.equal(Predictor(4, 3).offsets, torch.zeros(3))
