"""The ask/tell searcher (pipeline.search.asktell) and search()'s executor: both give search()'s run."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pipeline.search import Decision, SearchSpace, search
from pipeline.search.asktell import Searcher
from pipeline.search.synthetic import make_synthetic


@pytest.fixture(scope="module")
def objective():
    return make_synthetic(np.random.default_rng(3))


def same_run(a, b) -> None:
    assert [(e.index, e.iteration, e.arch, e.value, e.best_value) for e in a.history] == \
        [(e.index, e.iteration, e.arch, e.value, e.best_value) for e in b.history]
    assert a.iterations == b.iterations and a.stopped == b.stopped
    assert a.model.as_dict() == b.model.as_dict()


@pytest.mark.parametrize("variant", [{"restart_after": None}, {"restart_after": 10},
                                     {"restart_after": 10, "around": 0.0, "elite": 4, "local": 0.25}])
def test_ask_tell_in_any_order_through_json_is_search(objective, variant) -> None:
    budget = 203  # ends inside an iteration: the last points are cancelled, as search() skips them
    reference = search(objective.space, objective, budget=budget, seed=4, **variant)
    assert reference.evaluations == budget and len(reference.iterations) > 20
    assert any(r.get("restart") for r in reference.iterations) == bool(variant["restart_after"])  # restarts
    searcher = Searcher(objective.space, seed=4, **variant)
    while searcher.evaluations < budget:
        points = searcher.ask()
        assert points and searcher.ask() == []  # handed out once; nothing more until told
        searcher = Searcher.from_state(json.loads(json.dumps(searcher.state())))  # save, resume elsewhere
        assert sorted(searcher.ask(), key=str) == sorted(points, key=str)  # in-flight points handed out again
        take = points[:budget - searcher.evaluations]
        for a in points[len(take):]:
            searcher.cancel(a)
        for a in reversed(take):  # results come back in any order
            searcher.tell(a, objective(a))
    told = searcher.result()
    # the history is in tell order, so compare it as sets per iteration; the model and updates exactly
    assert told.iterations == reference.iterations and told.model.as_dict() == reference.model.as_dict()
    assert {(e.iteration, e.arch, e.value) for e in told.history} == \
        {(e.iteration, e.arch, e.value) for e in reference.history}


def test_tell_refuses_points_it_did_not_ask_or_already_has() -> None:
    space = SearchSpace((Decision("a", ("x", "y", "z")), Decision("b", ("u", "v"))))
    searcher = Searcher(space, seed=0, m=2)
    first, second = searcher.ask()
    searcher.tell(first.as_dict(), 1.0)  # a plain mapping works too
    with pytest.raises(ValueError, match="already told"):
        searcher.tell(first, 2.0)
    other = next(a for a in space.enumerate() if a not in (first, second))
    with pytest.raises(ValueError, match="not asked"):
        searcher.tell(other, 2.0)
    with pytest.raises(TypeError, match="a="):
        searcher.tell(second, "high")
    searcher.tell(second, math.nan)  # invalid point: recorded as None
    assert searcher.history[-1].value is None and searcher.best_value == 1.0
    assert searcher.pending == [] and len(searcher.iterations) == 1


def test_a_small_space_is_exhausted_and_stays_so() -> None:
    space = SearchSpace((Decision("a", ("x", "y")), Decision("b", ("u", "v", "w"))))
    searcher = Searcher(space, seed=1)
    while points := searcher.ask():
        for a in points:
            searcher.tell(a, float(space.index(a)[1]))
    assert searcher.stopped == "exhausted" and searcher.evaluations == 6 and searcher.ask() == []
    assert searcher.best_value == 2.0


def test_variants_change_the_run_and_bad_settings_are_refused(objective) -> None:
    base = [e.arch for e in search(objective.space, objective, budget=100, seed=0).history]
    for variant in ({"elite": 4}, {"local": 0.5}, {"around": 0.0}, {"centres": 2}, {"age": None}):
        assert [e.arch for e in search(objective.space, objective, budget=100, seed=0, **variant).history] != base
    for bad in ({"elite": -1}, {"local": 1.5}, {"utility": "z"}, {"m": 0}, {"restart_after": 0}):
        with pytest.raises(ValueError):
            Searcher(objective.space, **bad)


@pytest.mark.parametrize("bad", [{"format": "x"}, {"format": "pipeline.search.asktell/1", "space": []}])
def test_bad_state_is_a_clear_error(bad) -> None:
    with pytest.raises(ValueError, match="searcher state"):
        Searcher.from_state(bad)


def test_save_and_load_a_file(tmp_path, objective) -> None:
    searcher = Searcher(objective.space, seed=2)
    for a in searcher.ask():
        searcher.tell(a, objective(a))
    searcher.save(tmp_path / "s.json")
    again = Searcher.load(tmp_path / "s.json")
    assert again.state() == searcher.state() and again.ask() == searcher.ask()


# --- search(..., executor=...) -------------------------------------------------------------------


def test_executor_gives_the_serial_run(objective) -> None:
    top = objective.top_set(0.001)
    for kwargs in ({"budget": 150}, {"budget": 3000, "stop": lambda e: e.arch in top}):
        serial = search(objective.space, objective, seed=7, **kwargs)
        with ThreadPoolExecutor(4) as pool:
            parallel = search(objective.space, objective, seed=7, executor=pool, **kwargs)
        same_run(serial, parallel)
    assert parallel.stopped == "stop" and parallel.history[-1].arch in top


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_executor_failure_stops_cleanly_with_the_serial_history(objective, exc) -> None:
    serial_run = search(objective.space, objective, budget=100, seed=1)
    poison = serial_run.history[40].arch  # the 41st evaluation fails

    def evaluate(a):
        if a == poison:
            raise exc("boom")
        return objective(a)

    serial = search(objective.space, evaluate, budget=100, seed=1)
    with ThreadPoolExecutor(4) as pool:
        parallel = search(objective.space, evaluate, budget=100, seed=1, executor=pool)
    same_run(serial, parallel)
    assert parallel.evaluations == 40 and parallel.stopped == ("error" if exc is RuntimeError else "interrupted")
    assert (parallel.error is None) == (exc is KeyboardInterrupt)
