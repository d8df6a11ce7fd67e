from __future__ import annotations

import pytest
import torch

from pipeline.params.choices import ConfigError
from pipeline.routing.selection import (
    PRICES,
    PredictorConfig,
    choose_price,
    fit_predictor,
    routed_selection,
    static_selection,
)
from pipeline.search.space import Arch


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


ARCHS = [Arch.from_key("op@l1=skip"), Arch.from_key("op@l1=conv3")]


def test_static_selection_is_the_cheapest_within_delta_and_says_so() -> None:
    c_correct = torch.tensor([[1, 1], [1, 1], [0, 1], [1, 1]], dtype=torch.bool)  # 75% and 100% right
    selection, metrics, static = static_selection(2, "predictor", ARCHS, [100, 1000], c_correct, delta=0.3)
    assert static == 0 and selection["static"] == "op@l1=skip" and selection["predictor"] is None
    assert list(selection) == ["module", "mode", "candidates", "candidate_macs", "static", "static_calib_acc",
                               "calib_acc", "predictor"]  # selection.json's key order
    assert selection["calib_acc"] == [0.75, 1.0] and metrics == {"candidates": 2, "static_calib_acc": 0.75,
                                                                  "static_macs": 100}
    _, _, strict = static_selection(2, "predictor", ARCHS, [100, 1000], c_correct, delta=0.1)
    assert strict == 1


def test_routed_selection_serves_a_predictor_that_pays_and_falls_back_otherwise() -> None:
    features, correct = routed_task(600, seed=0)
    selection, metrics, static = static_selection(3, "predictor", ARCHS, [1000, 10000], correct, delta=0.0)
    assert static == 1
    cfg = PredictorConfig(scoring="p_right", epochs=30, seed=1)
    routed, routed_metrics, predictor = routed_selection(selection, metrics, static, features, correct,
                                                         correct.float(), [1000, 10000], cfg, 0.5, "m3")
    assert selection["predictor"] is None and "predictor_used" not in metrics  # inputs untouched
    assert routed_metrics["predictor_used"] is True and routed["mode"] == "predictor"
    assert routed["predictor"]["num_candidates"] == 2 and routed["predictor"]["scoring"] == "p_right"
    assert routed_metrics["predictor_mean_macs_heldout"] < 10000
    decision = routed["decision"]  # the held-out decision, as the evaluate stage's verdict reads it back
    assert decision["served"] is True and decision["held_out_images"] == 600 - int(0.8 * 600)
    assert decision["routed_acc_heldout"] == routed_metrics["predictor_routed_acc_heldout"]
    assert decision["static_acc_heldout"] == routed_metrics["static_acc_heldout"] and decision["static_macs"] == 10000
    assert decision["reason"].startswith("it is ")
    noise = torch.rand(features.shape, generator=torch.Generator().manual_seed(3))  # features carry nothing
    unpaid_selection, unpaid, _ = routed_selection(selection, metrics, static, noise, correct, correct.float(),
                                                   [1000, 10000], cfg, 0.5, "m3")
    assert unpaid["predictor_used"] is False
    assert unpaid_selection["mode"] == "testset" and unpaid_selection["decision"]["served"] is False
    with pytest.raises(ConfigError, match="select@m3: predictor costs .* lower select.hidden or select.pool"):
        routed_selection(selection, metrics, static, features, correct, correct.float(), [1000, 10000], cfg,
                         1e-6, "m3")
