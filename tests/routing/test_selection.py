from __future__ import annotations

import pytest
import torch

from pipeline.routing.selection import PRICES, PredictorConfig, choose_price, fit_predictor


def test_choose_price_is_the_cheapest_as_accurate_as_the_floor_within_budget() -> None:
    correct = torch.tensor([[1, 1], [0, 1], [0, 1], [1, 0]], dtype=torch.bool)  # (4, 2)
    macs = [1.0, 3.0]
    choices = {0.0: torch.tensor([1, 1, 1, 1]), 0.1: torch.tensor([0, 1, 1, 0]), 1.0: torch.tensor([0, 0, 0, 0])}
    # price 0.1: all 4 right at mean 2.0 MACs; price 0: 3 right at 3.0; price 1: 2 right at 1.0
    assert choose_price(correct, choices, macs, budget=3.0, floor=0.75) == (0.1, 1.0, 2.0)
    assert choose_price(correct, choices, macs, budget=3.0, floor=0.5) == (1.0, 0.5, 1.0)  # cheapest enough
    assert choose_price(correct, choices, macs, budget=1.5, floor=0.9) == (1.0, 0.5, 1.0)  # best within budget
    assert choose_price(correct, choices, macs, budget=0.5, floor=0.0) == (1.0, 0.5, 1.0)  # nothing fits
    with pytest.raises(ValueError):
        choose_price(correct, {}, macs, 1.0, 0.0)


def routed_task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Channel 0 bright <=> an easy image that the cheap candidate gets right; the dear one is always right."""
    g = torch.Generator().manual_seed(seed)
    easy = torch.rand(n, generator=g) < 0.6
    features = torch.rand(n, 3, 4, 4, generator=g)
    features[easy, 0] += 1.0
    correct = torch.stack([easy, torch.ones(n, dtype=torch.bool)], 1)  # (N, 2)
    return features, correct


def test_a_p_right_predictor_sends_easy_images_to_the_cheap_candidate() -> None:
    features, correct = routed_task(600, seed=0)
    macs = [100, 1000]
    fitted = fit_predictor(features, correct, correct.float(), macs, static=1,
                           cfg=PredictorConfig(scoring="p_right", epochs=30, seed=1))
    held = correct[fitted.n_fit:]
    rows = torch.arange(len(held))
    assert fitted.n_fit == 480 and fitted.metrics["predictor_price"] in PRICES
    assert float(held[rows, fitted.held_choice].float().mean()) > 0.95  # as right as the dear one
    assert 0.4 < float((fitted.held_choice == 0).float().mean()) < 0.8  # while the easy ones run cheap
    assert fitted.predictor.scoring == "p_right" and float(fitted.predictor.offsets[1]) < 0


def test_the_label_predictor_trains_on_the_cheapest_right_candidate() -> None:
    features, correct = routed_task(300, seed=2)
    fitted = fit_predictor(features, correct, correct.float(), [100, 1000], static=1,
                           cfg=PredictorConfig(scoring="label", epochs=30, seed=1))
    assert fitted.predictor.scoring == "label" and set(fitted.metrics) == {"predictor_label_acc_heldout",
                                                                          "label_share"}
    assert fitted.metrics["predictor_label_acc_heldout"] > 0.9
