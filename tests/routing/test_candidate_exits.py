"""Each routing candidate scored as a standalone exit behind the cascade (pipeline.evaluation.figures)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pipeline.evaluation.figures import candidate_correct, candidate_exits, routing_candidates, routing_oracle
from pipeline.io import write_json
from tests.routing.conftest import images


def scored_rows(stages, x, labels, kind, given=None):  # noqa: ANN001, ANN201
    return candidate_exits(candidate_correct(stages, x, labels, kind, given))


def test_candidate_exits_score_each_candidate_behind_the_cascade(tiny):  # noqa: ANN001
    x = images(40, seed=5)
    labels = np.arange(40) % 4
    rows = scored_rows(tiny.stages, x, labels, "maxprob")
    assert [(r["module"], r["path"]) for r in rows] == [
        (k + 1, a.key()) for k, s in enumerate(tiny.stages) if len(s.candidates) > 1 for a in s.candidates]
    with torch.no_grad():
        h, _ = tiny.modules[0](x)
        for row, arch in zip(rows[:3], tiny.stages[1].candidates, strict=True):
            _, logits = tiny.modules[1](h, arch)
            assert row["accuracy"] == float((logits.argmax(1).numpy() == labels).mean())
            assert row["macs"] == tiny.stages[0].candidate_macs[0] + tiny.stages[1].candidate_macs[
                tiny.stages[1].candidates.index(arch)]


def test_candidate_exits_score_the_given_candidates_where_the_cascade_runs_one_path(tiny):  # noqa: ANN001
    """A module whose predictor is not used runs one path; the select stage's candidates, passed in,
    are each scored behind the same prefix as if the cascade held them."""
    x = images(40, seed=5)
    labels = np.arange(40) % 4
    single = [dataclasses.replace(s, candidates=s.candidates[:1], candidate_macs=s.candidate_macs[:1],
                                  predictor=None) for s in tiny.stages]
    assert scored_rows(single, x, labels, "maxprob") == []
    given = [(s.candidates, s.candidate_macs) for s in tiny.stages]
    rows = scored_rows(single, x, labels, "maxprob", given)
    assert [(r["module"], r["path"]) for r in rows] == [
        (k + 1, a.key()) for k, s in enumerate(tiny.stages) if len(s.candidates) > 1 for a in s.candidates]
    # module 2's candidates sit behind module 1 alone, as in the routed cascade
    routed = scored_rows(tiny.stages, x, labels, "maxprob")
    assert [r for r in rows if r["module"] == 2] == [r for r in routed if r["module"] == 2]
    # module 3's sit behind module 2 as this cascade runs it: its one path, no predictor
    behind_one_path = scored_rows([*single[:2], tiny.stages[2]], x, labels, "maxprob")
    assert [r for r in rows if r["module"] == 3] == behind_one_path
    with pytest.raises(ValueError, match="candidates for 2 modules"):
        scored_rows(single, x, labels, "maxprob", given[:2])


def test_routing_oracle_takes_the_cheapest_right_candidate_per_image() -> None:
    correct = np.array([[True, True, False], [False, True, True], [False, False, True], [False, False, False]])
    scored = {3: {"paths": ["big", "cheap", "mid"], "macs": [0, 0, 0], "module_macs": [30, 10, 20],
                  "correct": correct}}
    oracle = routing_oracle(scored)[3]
    assert oracle["accuracy"] == 0.75
    assert oracle["mean_module_macs"] == (10 + 10 + 20 + 10) / 4  # cheap, cheap, mid, none right: cheapest


class _Costs:
    """The two things routing_candidates asks of a CostModel."""

    n_modules = 3

    def macs(self, k: int, arch) -> int:  # noqa: ANN001
        return 1000 * k + len(arch.key())


def test_routing_candidates_read_the_recorded_selection_else_keep_the_stage(tiny, tmp_path):  # noqa: ANN001
    recorded = tiny.stages[1].candidates[::-1]
    (tmp_path / "m2" / "select").mkdir(parents=True)
    write_json(tmp_path / "m2" / "select" / "selection.json", {"candidates": [a.key() for a in recorded]})
    got = routing_candidates(tmp_path, _Costs(), tiny.stages)
    assert got[1] == (tuple(recorded), tuple(_Costs().macs(2, a) for a in recorded))
    for k in (0, 2):  # no selection recorded: what the cascade's own stage runs
        assert got[k] == (tuple(tiny.stages[k].candidates), tuple(tiny.stages[k].candidate_macs))
    with pytest.raises(ValueError, match="3 modules"):
        routing_candidates(tmp_path, _Costs(), tiny.stages[:2])
