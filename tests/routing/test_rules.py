from __future__ import annotations

import pytest
import torch

from pipeline.routing.rules import (
    exit_mask,
    pays_reason,
    predictor_labels,
    predictor_pays,
    route_groups,
    static_choice,
)


def test_exit_mask_is_conf_at_least_threshold() -> None:
    conf = torch.tensor([0.2, 0.5, 0.9, 0.5])
    assert exit_mask(conf, 0.5).tolist() == [False, True, True, True]
    assert exit_mask(conf, float("-inf")).all()  # how the engine's last module would read
    assert not exit_mask(conf, 1.01).any()  # "never exit"
    assert exit_mask(conf, 0.0).all()


def test_exit_mask_rejects_a_matrix() -> None:
    with pytest.raises(ValueError, match=r"\(B,\)"):
        exit_mask(torch.zeros(2, 3), 0.5)


def test_route_groups_partitions_rows_in_candidate_order() -> None:
    choices = torch.tensor([2, 0, 2, 1, 0, 2])
    groups = route_groups(choices)
    assert [c for c, _ in groups] == [0, 1, 2]
    assert [rows.tolist() for _, rows in groups] == [[1, 4], [3], [0, 2, 5]]
    assert all(rows.dtype == torch.long for _, rows in groups)


def test_route_groups_skips_unchosen_candidates_and_empty_input() -> None:
    assert [c for c, _ in route_groups(torch.tensor([3, 3, 1]))] == [1, 3]
    assert route_groups(torch.zeros(0, dtype=torch.long)) == []


def test_route_groups_rejects_negative_choices() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        route_groups(torch.tensor([0, -1]))


def test_predictor_labels_hand_case() -> None:
    costs = [3.0, 1.0, 2.0, 1.0]
    correct = torch.tensor(
        [
            [True, True, True, False],  # cheapest right: 1
            [True, False, True, False],  # cheapest right: 2 (cost 2 < 3)
            [False, False, False, False],  # none right: highest p_true -> 0
            [False, True, False, True],  # tie on cost 1: lower index 1
            [True, False, False, False],  # only the dearest is right: 0
        ]
    )
    p_true = torch.tensor(
        [
            [0.1, 0.2, 0.3, 0.4],
            [0.9, 0.1, 0.1, 0.9],
            [0.5, 0.2, 0.1, 0.3],
            [0.0, 0.0, 0.0, 0.9],
            [0.1, 0.2, 0.9, 0.9],
        ]
    )
    assert predictor_labels(correct, p_true, costs).tolist() == [1, 2, 0, 1, 0]


def test_predictor_labels_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="costs"):
        predictor_labels(torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 3), [1.0, 2.0])
    with pytest.raises(ValueError, match="one shape"):
        predictor_labels(torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 2), [1.0, 2.0, 3.0])


def test_predictor_pays_only_when_it_loses_no_accuracy_for_its_savings() -> None:
    assert predictor_pays(0.90, 1e6, 0.90, 2e6)  # as accurate, cheaper
    assert predictor_pays(0.91, 3e6, 0.90, 2e6)  # more accurate, dearer
    assert not predictor_pays(0.90, 3e6, 0.90, 2e6)  # as accurate, dearer
    assert not predictor_pays(0.85, 1e6, 0.90, 2e6)  # cheaper but loses 5 points
    assert predictor_pays(0.899, 1e6, 0.90, 2e6, tolerance=0.002)  # a loss inside the tolerance


def test_pays_reason_names_the_clause_that_decided_and_agrees_with_predictor_pays() -> None:
    assert pays_reason(0.90, 1e6, 0.90, 2e6) == (
        True, "it is as accurate as the static choice (within select.fallback_tolerance) at no more MACs")
    assert pays_reason(0.91, 3e6, 0.90, 2e6) == (True, "it is more accurate than the static choice")
    served, why = pays_reason(0.90, 3e6, 0.90, 2e6)
    assert not served and "costs more MACs (3,000,000 against 2,000,000" in why
    served, why = pays_reason(0.85, 1e6, 0.90, 2e6, tolerance=0.01)
    assert not served and "loses 5.00 points" in why and "more than the 1.00 allowed" in why
    for routed in (0.85, 0.899, 0.90, 0.91):
        for macs in (1e6, 2e6, 3e6):
            for tol in (0.0, 0.002):
                assert pays_reason(routed, macs, 0.90, 2e6, tol)[0] == predictor_pays(routed, macs, 0.90, 2e6, tol)


def test_static_choice_is_the_cheapest_candidate_within_delta_of_the_best() -> None:
    acc, macs = [0.883, 0.897, 0.904], [1.3e6, 4.5e6, 6.4e6]
    assert static_choice(acc, macs, 0.003) == 2
    assert static_choice(acc, macs, 0.01) == 1
    assert static_choice(acc, macs, 0.05) == 0
    assert static_choice([0.9, 0.9], [2.0, 2.0], 0.0) == 0  # full tie: lower index
    with pytest.raises(ValueError, match="one accuracy per candidate"):
        static_choice([0.9], [1.0, 2.0], 0.0)
