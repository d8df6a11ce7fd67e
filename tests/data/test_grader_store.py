from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.data.grader_store import grader_proba, levels_of, load_grader, save_grader
from pipeline.data.grading import make_scorer
from pipeline.params.config import GradeConfig


def images_and_labels(n: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    base = rng.integers(0, 256, (classes, 1, 6, 6))
    noise = rng.normal(0, 60, (n, 1, 6, 6))
    return np.clip(base[labels] + noise, 0, 255).astype(np.uint8), labels


def config(scorer: str) -> GradeConfig:
    return GradeConfig(seed=0, scorer=scorer, pca_components=8, folds=2, levels=3, curriculum="weighted",
                       level_weight=2, max_iter=200, knn_neighbors=5)


@pytest.mark.parametrize(("scorer", "classes"), [("pca-logreg", 4), ("pca-logreg", 2), ("knn", 4)])
def test_the_stored_grader_answers_as_scikit_learn(tmp_path: Path, scorer: str, classes: int) -> None:
    x, y = images_and_labels(300, classes, seed=1)
    model = make_scorer(config(scorer), 36).fit(x, y)
    save_grader(tmp_path / "grader.npz", model)
    arrays = load_grader(tmp_path / "grader.npz")
    test, _ = images_and_labels(120, classes, seed=2)
    np.testing.assert_allclose(grader_proba(arrays, test), model.predict_proba(test), atol=1e-5)


def test_levels_of_bins_scores_at_the_training_edges(tmp_path: Path) -> None:
    x, y = images_and_labels(200, 3, seed=3)
    model = make_scorer(config("pca-logreg"), 36).fit(x, y)
    save_grader(tmp_path / "grader.npz", model)
    pd.DataFrame({"id": range(4), "label": 0, "score": [0.1, 0.3, 0.6, 0.9], "level": [1, 1, 2, 3]}
                 ).to_csv(tmp_path / "scores.csv", index=False)
    levels = levels_of(load_grader(tmp_path / "grader.npz"), x, y, tmp_path / "scores.csv")
    scores = 1.0 - model.predict_proba(x)[np.arange(len(y)), y]
    np.testing.assert_array_equal(levels, np.where(scores <= 0.3, 1, np.where(scores <= 0.6, 2, 3)))


def test_a_pickle_or_garbage_is_refused_naming_the_file(tmp_path: Path) -> None:
    import pickle

    bad = tmp_path / "grader.npz"
    bad.write_bytes(pickle.dumps({"kind": "logreg"}))
    with pytest.raises(ValueError, match="grader.npz: not a grader file"):
        load_grader(bad)
    np.savez(bad, kind=np.array("logreg"))
    with pytest.raises(ValueError, match="missing"):
        load_grader(bad)
