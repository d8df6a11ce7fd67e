"""bench/archive/routing_predictability.py's pure parts: the disagreement AUC, sending the top share, the
per-candidate learners and the features (the bench itself needs a trained workspace)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.archive.routing_predictability import disagreement_auc, image_features, learners, p_right, pooled, send_top

# 6 images, candidates (twin 0, other 1): images 0-1 only the other is right, 2-3 only the twin, 4-5 both
RIGHT = np.array([[0, 1], [0, 1], [1, 0], [1, 0], [1, 1], [1, 1]], dtype=bool)


def test_disagreement_auc_reads_only_the_images_where_the_two_disagree() -> None:
    perfect = np.array([0.9, 0.8, 0.1, 0.2, -5.0, 5.0])  # the agreeing images' scores must not count
    assert disagreement_auc(perfect, RIGHT, 1, 0) == 1.0
    assert disagreement_auc(-perfect, RIGHT, 1, 0) == 0.0
    assert disagreement_auc(np.zeros(6), RIGHT, 1, 0) == 0.5
    assert disagreement_auc(perfect, RIGHT[:, [0, 0]], 1, 0) is None  # no disagreement at all


def test_send_top_swaps_the_top_share_to_the_other_candidate() -> None:
    gain = np.array([0.9, 0.8, 0.1, 0.2, 0.0, 0.0])
    assert send_top(gain, RIGHT, 1, 0, 0.0) == pytest.approx(4 / 6)  # the twin alone
    assert send_top(gain, RIGHT, 1, 0, 2 / 6) == 1.0  # the two it gains
    assert send_top(gain[[2, 3, 0, 1, 4, 5]], RIGHT, 1, 0, 2 / 6) == pytest.approx(2 / 6)  # the two it loses


def test_p_right_learns_a_learnable_rule_and_keeps_a_constant_label() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3))
    right = np.stack([x[:, 0] > 0, np.ones(400, dtype=bool)], 1)
    for make in learners(0).values():
        p = p_right(make, x[:300], right[:300], x[300:])
        assert p.shape == (100, 2)
        assert ((p[:, 0] > 0.5) == right[300:, 0]).mean() > 0.9
        assert (p[:, 1] == 1.0).all()


def test_image_features_are_pooled_input_grid_probabilities_max_and_entropy() -> None:
    inputs = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    probs = torch.tensor([[0.5, 0.5], [1.0, 0.0]]).reshape(2, 2, 1, 1)
    f = image_features(inputs, probs)
    assert f.shape == (2, 3 + 12 + 2 + 1 + 1)
    assert f[0, 0] == pytest.approx(inputs[0, 0].mean().item())
    assert f[:, -2].tolist() == [0.5, 1.0]
    assert f[0, -1] == pytest.approx(np.log(2)) and f[1, -1] == pytest.approx(0.0, abs=1e-9)


def test_pooled_is_the_spatial_mean_then_the_2x2_grid() -> None:
    maps = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    f = pooled(maps)
    assert f.shape == (2, 3 + 12)
    assert f[1, 2] == pytest.approx(maps[1, 2].mean().item())
    assert f[0, 3] == pytest.approx(maps[0, 0, :2, :2].mean().item())  # channel 0's top-left cell
