"""Method B's picks around the restart's best archs (docs/RESULTS.md "Method B against the NAS baselines";
pipeline.search.neighbourhood) and the tree model
(pipeline.search.treemodel), and their settings in the ask/tell searcher."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.search import Decision, SearchSpace, search
from pipeline.search.asktell import Searcher
from pipeline.search.neighbourhood import annealed_rate, centre_weights, neighbourhood_picks
from pipeline.search.probmodel import ProbModel, rank_weights
from pipeline.search.synthetic import make_synthetic
from pipeline.search.treemodel import chow_liu, order, pair_mi, product_joints, tree_pick, update_joints

SPACE = SearchSpace(tuple(Decision(f"d{j}", tuple("abcde")) for j in range(4)))


def differences(a, b) -> int:
    return sum(x != y for x, y in zip(SPACE.index(a), SPACE.index(b), strict=True))


def test_one_change_picks_differ_from_their_centre_in_one_decision() -> None:
    centres = [SPACE.from_index((0, 0, 0, 0)), SPACE.from_index((4, 4, 4, 4))]
    model = ProbModel.uniform(SPACE)
    picks = neighbourhood_picks(model, centres, np.array([0.5, 0.5]), 12, np.random.default_rng(0))
    assert len(picks) == len(set(picks)) == 12
    assert all(min(differences(p, c) for c in centres) == 1 for p in picks)
    assert {differences(p, centres[0]) == 1 for p in picks} == {True, False}  # both centres drawn


def test_the_redrawn_choice_follows_p_and_never_repeats_the_centre() -> None:
    centre = SPACE.from_index((0, 0, 0, 0))
    model = ProbModel.from_probs(SPACE, [[0.5, 0.5, 0.0, 0.0, 0.0]] * 4)  # P: only a or b
    picks = neighbourhood_picks(model, [centre], np.ones(1), 4, np.random.default_rng(1))
    assert len(picks) == 4 and all(max(SPACE.index(p)) == 1 and differences(p, centre) == 1 for p in picks)


def test_avoided_points_are_skipped_and_a_spent_neighbourhood_gives_fewer() -> None:
    centre = SPACE.from_index((0, 0, 0, 0))
    model = ProbModel.uniform(SPACE)
    everything = neighbourhood_picks(model, [centre], np.ones(1), 100, np.random.default_rng(2), tries=50)
    assert len(everything) == 16  # 4 decisions x 4 other choices
    rest = neighbourhood_picks(model, [centre], np.ones(1), 8, np.random.default_rng(2), avoid=set(everything[:14]))
    assert set(rest) == set(everything[14:])


def test_rate_one_redraws_every_decision_and_bad_rates_are_refused() -> None:
    centre = SPACE.from_index((0, 0, 0, 0))
    picks = neighbourhood_picks(ProbModel.uniform(SPACE), [centre], np.ones(1), 10, np.random.default_rng(3), 1.0)
    assert all(differences(p, centre) == 4 for p in picks)
    assert annealed_rate(ProbModel.uniform(SPACE)) == 1.0
    assert annealed_rate(ProbModel.from_probs(SPACE, [[1.0, 0, 0, 0, 0]] * 4)) == 0.25
    for bad in (0.0, 1.5, "x", True):
        with pytest.raises(ValueError):
            neighbourhood_picks(ProbModel.uniform(SPACE), [centre], np.ones(1), 1, np.random.default_rng(0), bad)


def test_centre_weights_are_the_rank_weights_and_survive_invalid_centres() -> None:
    assert centre_weights([3.0, 2.0, 1.0]).tolist() == pytest.approx(rank_weights(np.array([3.0, 2.0, 1.0])).tolist())
    assert centre_weights([None, None]).tolist() == [0.5, 0.5]


def test_the_tree_finds_a_dependent_pair_and_samples_it() -> None:
    rng = np.random.default_rng(4)
    model = ProbModel.uniform(SPACE)
    joints = product_joints(model)
    assert all(pair_mi(t) == pytest.approx(0.0, abs=1e-12) for t in joints.values())
    # the good archs have d1 == d3: their pair table carries the dependency, the others do not
    archs = [SPACE.from_index((int(rng.integers(5)), c, int(rng.integers(5)), c)) for c in range(5)] * 4
    joints = update_joints(joints, SPACE, archs, np.ones(len(archs)), 0.02, 1.0)
    parent = chow_liu(joints, 4)
    assert parent[0] == -1 and (parent[3] == 1 or parent[1] == 3)
    assert order(parent)[0] == 0 and sorted(order(parent)) == [0, 1, 2, 3]
    picks = tree_pick(model, joints, 10, rng)
    assert len(set(picks)) == 10
    assert sum(SPACE.index(p)[1] == SPACE.index(p)[3] for p in picks) >= 8


@pytest.fixture(scope="module")
def objective():
    return make_synthetic(np.random.default_rng(3))


@pytest.mark.parametrize("variant", [{}, {"around": 0.875, "centres": 8, "age": 20, "restart_after": None},
                                     {"around": 0.5, "rate": 0.2, "initial": 16},
                                     {"structure": "tree", "around": 0.5}])
def test_the_new_settings_resume_through_json_and_match_search(objective, variant) -> None:
    reference = search(objective.space, objective, budget=120, seed=5, **variant)
    searcher = Searcher(objective.space, seed=5, **variant)
    while searcher.evaluations < 120:
        points = searcher.ask()
        searcher = Searcher.from_state(json.loads(json.dumps(searcher.state())))
        take = points[:120 - searcher.evaluations]
        for a in points[len(take):]:
            searcher.cancel(a)
        for a in take:
            searcher.tell(a, objective(a))
    told = searcher.result()
    assert [(e.arch, e.value) for e in told.history] == [(e.arch, e.value) for e in reference.history]
    assert told.iterations == reference.iterations and told.model.as_dict() == reference.model.as_dict()
    plain = search(objective.space, objective, budget=120, seed=5, around=0.0, restart_after=10)  # before 40
    assert [e.arch for e in plain.history] != [e.arch for e in reference.history]


def test_bad_settings_are_refused() -> None:
    for bad in ({"around": 1.5}, {"centres": 0}, {"age": 0}, {"initial": True}, {"rate": 2.0},
                {"structure": "graph"}):
        with pytest.raises(ValueError):
            Searcher(SPACE, **bad)
