import numpy as np
import pandas as pd
import pytest

from pipeline.data.grading import Grading, assign_levels, curriculum_levels, curriculum_repeats, grade
from pipeline.data.sources import load_digits
from pipeline.data.validation import validate_grading
from pipeline.params.config import GradeConfig

CFG = GradeConfig(scorer="pca-logreg", pca_components=16, folds=3, levels=3, curriculum="cumulative",
                  max_iter=200, knn_neighbors=5, seed=0)


def test_levels_are_equal_size_and_ordered():
    rng = np.random.default_rng(0)
    scores = rng.random(1000)
    ids = np.array([f"x{i}" for i in range(1000)])
    levels = assign_levels(scores, ids, 4)
    assert np.bincount(levels)[1:].tolist() == [250] * 4
    means = [scores[levels == lv].mean() for lv in range(1, 5)]
    assert means == sorted(means)


@pytest.mark.parametrize("mode,expected", [("cumulative", [(1,), (1, 2), (1, 2, 3)]),
                                           ("exclusive", [(1,), (2,), (3,)]),
                                           ("all", [(1, 2, 3)] * 3)])
def test_curriculum_levels(mode, expected):
    assert [curriculum_levels(k, 3, mode) for k in (1, 2, 3)] == expected


def test_weighted_curriculum_sees_every_level_and_its_own_most():
    assert [curriculum_repeats(k, 3, "weighted", 3) for k in (1, 2, 3)] == [(3, 1, 1), (1, 3, 1), (1, 1, 3)]
    assert curriculum_levels(1, 3, "weighted") == (1, 2, 3)
    with pytest.raises(ValueError, match="level_weight"):
        curriculum_repeats(1, 3, "weighted", 0)


def test_module_ids_repeat_the_weighted_level():
    ids = np.array(["a", "b", "c", "d"])
    grading = Grading(ids, np.zeros(4, int), np.array([0.1, 0.5, 0.9, 0.2]), np.array([1, 2, 3, 1]))
    assert grading.module_ids(1, 3, "weighted", 2).tolist() == ["a", "a", "b", "c", "d", "d"]
    assert grading.module_ids(3, 3, "cumulative").tolist() == ["a", "b", "c", "d"]
    assert grading.module_ids(2, 3, "exclusive").tolist() == ["b"]


def test_grading_is_out_of_fold_deterministic_and_monotone():
    data = load_digits(8)
    train = data.train
    grading, model = grade(train.images, train.labels, train.ids, CFG)
    again, _ = grade(train.images, train.labels, train.ids, CFG)
    assert np.array_equal(grading.scores, again.scores)
    assert 0.0 <= grading.scores.min() and grading.scores.max() <= 1.0
    # the fitted model grades unseen images: raw uint8 in, probabilities out
    assert model.predict_proba(train.images[:5]).shape == (5, 10)
    # curriculum monotonicity: module k's set is never harder (by mean score) than module k+1's
    means = [grading.scores[np.isin(grading.ids, grading.module_ids(k, 3, "cumulative"))].mean() for k in (1, 2, 3)]
    assert means[0] <= means[1] <= means[2]
    scores = pd.DataFrame({"id": grading.ids, "label": grading.labels, "score": grading.scores,
                           "level": grading.levels})
    assert validate_grading(scores, train.ids, 3).success


def test_grading_checks_catch_a_missing_id_and_a_duplicate():
    ids = np.array([f"i{i}" for i in range(30)])
    scores = pd.DataFrame({"id": ids, "label": 0, "score": np.linspace(0, 1, 30), "level": np.repeat([1, 2, 3], 10)})
    broken = scores.copy()
    broken.loc[5, "id"] = "i4"
    result = validate_grading(broken, ids, 3)
    assert not result.success
    assert any("expect_column_values_to_be_unique(id)" in f for f in result.failures)
    assert any("i5" in f for f in result.failures)


def test_grading_checks_catch_non_increasing_difficulty():
    ids = np.array([f"i{i}" for i in range(30)])
    scores = pd.DataFrame({"id": ids, "label": 0, "score": np.linspace(1, 0, 30), "level": np.repeat([1, 2, 3], 10)})
    result = validate_grading(scores, ids, 3)
    assert not result.success
    assert any("mean_score" in f for f in result.failures)
