"""Routing's verdict per supernet in every evaluate run (pipeline.evaluation.routing_verdict)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.evaluation.routing_verdict import (
    auc_words,
    headroom,
    held_out_predictability,
    routing_verdicts,
    served_from,
    served_reason,
    verdict_lines,
)
from pipeline.io import write_json
from pipeline.routing.engine import run_all_exits
from tests.routing import conftest as routing_fixtures
from tests.routing.conftest import images

tiny = routing_fixtures.tiny  # the tiny three-module cascade of tests/routing (a fixture)

DECISION = {"served": False, "reason": "it is no more accurate than the static choice and costs more MACs",
            "held_out_images": 600, "routed_acc_heldout": 0.935, "routed_mean_macs_heldout": 1036064.0,
            "static_acc_heldout": 0.935, "static_macs": 1035520, "tolerance": 0.0}


def test_headroom_is_the_oracle_against_the_served_choice_and_what_it_is_worth_to_the_cascade() -> None:
    correct = np.array([[True, True], [False, True], [False, True], [False, False]])  # (4, 2)
    choice, reached = np.array([0, 0, 0, 0]), np.array([True, True, False, False])
    room = headroom(correct, [100, 300], choice, reached)
    assert room["oracle_exit_accuracy"] == 0.75 and room["served_exit_accuracy"] == 0.25
    assert room["accuracy_points"] == pytest.approx(50.0)
    assert room["oracle_module_macs"] == (100 + 300 + 300 + 100) / 4  # cheapest right, else cheapest
    assert room["served_module_macs"] == 100
    assert room["images_reaching"] == 2 and room["accuracy_points_on_reaching"] == pytest.approx(50.0)
    assert room["cascade_points_at_most"] == pytest.approx(25.0)  # 2 of 4 images reach the module
    routed = headroom(correct, [100, 300], np.array([0, 1, 1, 0]), reached, extra_macs=7)
    assert routed["accuracy_points"] == pytest.approx(0.0) and routed["served_module_macs"] == 200 + 7
    assert headroom(correct, [100, 300], np.array([0, -1, 0, 0]), reached) is None  # a path not recorded


def test_served_reason_reads_the_select_stages_held_out_decision() -> None:
    why = served_reason({"mode": "testset", "predictor": {"macs": 5}, "decision": DECISION}, used=False)
    assert why.startswith("on 600 held-out route images it was 93.50% right at 1,036,064 MACs against the static "
                          "choice's 93.50% at 1,035,520: it does not serve, as it is no more accurate")
    served = served_reason({"predictor": {}, "decision": {**DECISION, "served": True, "reason": "it is more "
                                                          "accurate than the static choice"}}, used=True)
    assert ": it serves, as it is more accurate" in served
    assert "select.mode: testset" in served_reason({"mode": "testset", "predictor": None}, used=False)
    assert "re-run select" in served_reason({"mode": "testset", "predictor": {}}, used=False)
    assert "no selection" in served_reason(None, used=False)


def test_auc_words() -> None:
    assert [auc_words(a) for a in (None, 0.45, 0.65, 0.9)] == [
        "not measurable here", "not predictable in advance", "weakly predictable", "predictable"]


def _single(tiny):  # noqa: ANN001, ANN202
    """The tiny cascade's static twin: every module on its first candidate, no predictor."""
    return [dataclasses.replace(s, candidates=s.candidates[:1], candidate_macs=s.candidate_macs[:1], predictor=None)
            for s in tiny.stages]


def test_held_out_predictability_fits_on_one_split_and_reads_on_the_other(tiny) -> None:  # noqa: ANN001
    twin = _single(tiny)
    recorded = [(s.candidates, s.candidate_macs) for s in tiny.stages]
    fit = (images(80, seed=1), np.arange(80) % 4)
    held = (images(60, seed=2), np.arange(60) % 4)
    found = held_out_predictability(twin, recorded, fit, held, "maxprob", 0.0)
    assert sorted(found) == [2, 3]  # the modules with several recorded candidates
    for k, r in ((2, 3), (3, 2)):
        assert found[k]["fit_images"] == 80 and found[k]["held_out_images"] == 60  # NEVER thresholds: all reach
        assert [row["candidate"] for row in found[k]["per_candidate"]] == list(range(1, r))  # twin: candidate 0
        assert found[k]["auc"] is None or 0.0 <= found[k]["auc"] <= 1.0
    # an exit 1 that lets nothing through leaves module 2 nothing to learn from
    closed = [dataclasses.replace(twin[0], threshold=0.0), *twin[1:]]
    assert "too few images" in held_out_predictability(closed, recorded, fit, held, "maxprob", 0.0)[2]["note"]
    elsewhere = [(s.candidates[1:], s.candidate_macs[1:]) if k == 1 else c
                 for k, (s, c) in enumerate(zip(tiny.stages, recorded, strict=True))]
    assert "not a recorded candidate" in held_out_predictability(twin, elsewhere, fit, held, "maxprob", 0.0)[2]["note"]


def test_served_from_maps_the_cascades_routes_onto_the_recorded_candidates(tiny) -> None:  # noqa: ANN001
    x = images(30, seed=4)
    ran = run_all_exits(tiny.stages, x)["choices"].numpy()
    recorded = [(s.candidates, s.candidate_macs) for s in tiny.stages]
    got = served_from(tiny.stages, recorded, ran)
    assert sorted(got) == [2, 3] and np.array_equal(got[2], ran[:, 1]) and np.array_equal(got[3], ran[:, 2])
    reversed_order = [(c[::-1], m[::-1]) for c, m in recorded]
    assert np.array_equal(served_from(tiny.stages, reversed_order, ran)[2], 2 - ran[:, 1])
    static = served_from(_single(tiny), recorded, run_all_exits(_single(tiny), x)["choices"].numpy())
    assert (static[2] == 0).all() and (static[3] == 0).all()


def test_routing_verdicts_add_the_verdict_to_each_row(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "m3" / "select").mkdir(parents=True)
    write_json(tmp_path / "m3" / "select" / "selection.json",
               {"mode": "testset", "predictor": {}, "decision": DECISION})
    table = [{"module": 3, "predictor_used": False, "images_reaching": 2, "candidates": [], "oracle": None}]
    correct = np.array([[True, False], [False, True], [True, True], [False, False]])
    scored = {3: {"correct": correct, "module_macs": [100, 300]}}
    reached = np.array([[True] * 4, [True, True, False, False], [True, True, False, False]]).T  # (N, K)
    pred = {3: {"auc": 0.52, "per_candidate": [{"candidate": 1, "auc": 0.52, "held_out_disagreements": 40}]}}
    cascade, static = {"accuracy": 0.9, "mean_macs": 1e6}, {"accuracy": 0.9, "mean_macs": 1e6}
    [row] = routing_verdicts(table, tmp_path, scored, {3: np.zeros(4, int)}, reached, [0, 0, 544], pred, cascade,
                             static)
    assert row["module"] == 3 and row["served"] is False and row["predictability"] == pred[3]
    assert row["headroom"]["cascade_points_at_most"] == pytest.approx(100 * 0.5 * 2 / 4)
    assert row["vs_static_twin"] == {"accuracy_points": 0.0, "macs_ratio": 1.0, "met": False}
    assert row["verdict"].startswith("Module 3 does not route: on 600 held-out route images")
    assert "not predictable in advance (AUC 0.52 on 40 disagreements in held-out calib)" in row["verdict"]
    assert "would add at most 25.00 points to the cascade" in row["verdict"]
    lines = verdict_lines({"routing": [row]})
    assert lines[0].startswith("routing verdict, module 3: not served; predictability AUC 0.520")
    assert "vs static twin +0.00 points at 1.00x MACs" in lines[0] and lines[1] == f"  {row['verdict']}"
    # no selection recorded, no AUC measured: still a verdict, saying so
    [bare] = routing_verdicts([{**table[0], "module": 2}], tmp_path, {}, {}, reached, [0, 0, 0], {}, cascade, static)
    assert bare["headroom"] is None and bare["predictability"]["auc"] is None
    assert "no selection" in bare["verdict"] and "not measurable here" in bare["verdict"]
