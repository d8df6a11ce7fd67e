"""How predictable the right routing candidate is (pipeline.routing.predictability)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from pipeline.routing.predictability import (
    disagreement_auc,
    image_features,
    module_inputs,
    p_right,
    pooled,
    predictability,
)
from tests.routing.conftest import images


def test_image_features_pool_the_input_then_add_the_previous_exit() -> None:
    maps = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    probs = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    f = image_features(maps, probs)
    assert f.shape == (2, 5 * 3 + 2 + 2) and f.dtype == np.float64
    assert np.allclose(f[:, :3], maps.mean(dim=(2, 3)).numpy())
    assert np.allclose(f[0, 3:7], maps[0, 0].reshape(2, 2, 2, 2).mean(dim=(1, 3)).flatten().numpy())  # 2x2 grid
    assert np.allclose(f[:, 15:17], probs.numpy()) and np.allclose(f[:, 17], [0.5, 1.0])
    assert f[0, 18] == pytest.approx(np.log(2)) and f[1, 18] == pytest.approx(0.0, abs=1e-9)  # entropy
    # module 1: no exit before it, so the pooled input alone
    assert np.array_equal(image_features(maps, torch.zeros(2, 0)), pooled(maps))
    with pytest.raises(ValueError, match="2 inputs but 3 probability rows"):
        image_features(maps, torch.zeros(3, 2))


def test_module_inputs_run_the_modules_before_k_on_their_first_path(tiny) -> None:  # noqa: ANN001
    x = images(10, seed=1)
    inputs, probs = module_inputs(tiny.stages, x, 3, batch_size=4)
    with torch.no_grad():
        h, _ = tiny.modules[0](x, tiny.stages[0].candidates[0])
        h, logits = tiny.modules[1](h, tiny.stages[1].candidates[0])
    assert torch.allclose(inputs, h, atol=1e-5) and torch.allclose(probs, logits.softmax(-1), atol=1e-5)
    first, none = module_inputs(tiny.stages, x, 1)
    assert torch.equal(first, x) and none.shape == (10, 0)
    with pytest.raises(ValueError, match="module 4 is not in a cascade of 3"):
        module_inputs(tiny.stages, x, 4)


def test_disagreement_auc_ranks_the_images_where_the_candidate_beats_the_twin() -> None:
    right = np.array([[True, False], [True, False], [False, True], [False, True], [True, True]])
    assert disagreement_auc(np.array([0.9, 0.8, 0.1, 0.2, 0.0]), right, 1, 0) == 0.0  # gain favours j where it loses
    assert disagreement_auc(np.array([0.1, 0.2, 0.9, 0.8, 0.0]), right, 1, 0) == 1.0
    assert disagreement_auc(np.zeros(5), right[:, [0, 0]], 1, 0) is None  # they never disagree


def test_p_right_is_a_constant_where_a_candidate_is_always_or_never_right() -> None:
    x = np.random.default_rng(0).normal(size=(20, 3))
    right = np.stack([np.ones(20, bool), x[:, 0] > 0], 1)
    p = p_right(LogisticRegression, x, right, x[:5])
    assert p.shape == (5, 2) and (p[:, 0] == 1.0).all() and ((p[:, 1] > 0.5) == (x[:5, 0] > 0)).all()


def cued(n: int, seed: int, cue: bool) -> tuple[np.ndarray, np.ndarray]:
    """Two candidates; on half the images they disagree, and which one is right follows feature 0 (the
    cue) when ``cue``, else nothing the features hold."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    family = (x[:, 0] > 0) if cue else rng.random(n) > 0.5
    disagree = rng.random(n) < 0.5
    right = np.ones((n, 2), bool)
    right[disagree, 0] = ~family[disagree]
    right[disagree, 1] = family[disagree]
    return x, right


def test_predictability_is_high_with_a_cue_and_a_coin_without() -> None:
    x_fit, r_fit = cued(600, 0, cue=True)
    x_held, r_held = cued(600, 1, cue=True)
    found = predictability(x_fit, r_fit, x_held, r_held, twin=0)
    assert found["auc"] > 0.95 and found["fit_images"] == 600 and found["held_out_images"] == 600
    [row] = found["per_candidate"]
    assert row["candidate"] == 1 and row["auc"] == found["auc"]  # two candidates: the pooled AUC is j's
    assert row["held_out_disagreements"] == int((r_held[:, 0] != r_held[:, 1]).sum())
    x_fit, r_fit = cued(600, 2, cue=False)
    x_held, r_held = cued(600, 3, cue=False)
    assert 0.35 < predictability(x_fit, r_fit, x_held, r_held, twin=0)["auc"] < 0.65


def test_predictability_says_why_it_has_no_auc() -> None:
    x, right = cued(50, 0, cue=True)
    same = np.repeat(right[:, :1], 2, axis=1)  # the candidates never disagree on the held-out images
    found = predictability(x, right, x, same, twin=0)
    assert found["auc"] is None and "an AUC needs both" in found["note"]
    few = predictability(x[:1], right[:1], x, right, twin=0)
    assert few["auc"] is None and "too few images reach the module (1 to fit" in few["note"]
    with pytest.raises(ValueError, match="twin 2"):
        predictability(x, right, x, right, twin=2)
