"""The evaluate stage's library (pipeline.evaluation.suite): the static twins of a cascade, the headline
figures, the closing summary line and the plot/CSV folder."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from pipeline.evaluation.suite import headline, static_stages, summary_line, write_evaluation_plots
from pipeline.models.cascade import CascadeSpec, build_modules, feature_shapes
from pipeline.models.cost import fixed_macs, op_mac_table
from pipeline.models.modules import ModuleSpec
from pipeline.models.profile import CostModel
from pipeline.routing.engine import build_stage
from pipeline.routing.predictor import Predictor
from pipeline.search.space import Arch

SPEC = CascadeSpec(1, 3, 12, (
    ModuleSpec("fixed", 4, 1, 1),
    ModuleSpec("supernet", 8, 2, 2, ("conv3", "dw3", "skip"), "dw3"),
))
# module 2 routes between two paths, neither of them the space's largest or smallest
CANDIDATES = ((Arch(),),
              (Arch((("op@l1", "dw3"), ("op@l2", "conv3"))), Arch((("op@l1", "dw3"), ("op@l2", "dw3")))))


@pytest.fixture(scope="module")
def tiny():
    modules, shapes = build_modules(SPEC, seed=0), feature_shapes(SPEC)
    modules.eval()
    costs = CostModel({"modules": [{"fixed_macs": fixed_macs(m, s), "op_macs": op_mac_table(m, s)}
                                   for m, s in zip(modules, shapes, strict=False)]})
    stages = [build_stage(m, shapes[k], CANDIDATES[k], 0.5,
                          Predictor(shapes[k][0], 2, hidden=4, seed=k) if k else None)
              for k, m in enumerate(modules)]
    return stages, costs


def _check_static(stages, costs, which: str, arch: Arch, macs: int | None) -> None:
    out = static_stages(stages, costs, which)
    assert len(out) == 2
    for k, stage in enumerate(out, start=1):
        assert stage.module is stages[k - 1].module and stage.predictor is None
        assert len(stage.candidates) == 1 and math.isinf(stage.threshold)  # no routing, no early exit
        assert stage.candidate_macs == (costs.macs(k, stage.candidates[0]),)
    assert out[0].candidates == (Arch(),)  # the fixed module has one path whatever ``which``
    assert out[1].candidates == (arch,)
    if macs is not None:
        assert out[1].candidate_macs == (macs,)


@pytest.mark.parametrize("which", ["smallest_candidate", "space_largest", "space_smallest", "default"])
def test_static_stages_pick_one_path_per_module(tiny, which):
    stages, costs = tiny
    big, small = stages[1].candidate_macs
    assert big > small  # dw3 then conv3 costs more than dw3 twice: the fixture's premise
    arch, macs = {"smallest_candidate": (CANDIDATES[1][1], small),
                  "space_largest": (Arch((("op@l1", "conv3"), ("op@l2", "conv3"))), costs.max_macs(2)),
                  "space_smallest": (Arch((("op@l1", "skip"), ("op@l2", "skip"))), costs.min_macs(2)),
                  "default": (Arch((("op@l1", "dw3"), ("op@l2", "dw3"))), None)}[which]
    _check_static(stages, costs, which, arch, macs)


def test_static_stages_largest_candidate_is_the_most_expensive(tiny):
    stages, costs = tiny
    _check_static(stages, costs, "largest_candidate", CANDIDATES[1][0], max(stages[1].candidate_macs))


def _results(noisy: bool) -> dict:
    return {"cascade": {"accuracy": 0.912345, "mean_macs": 2_345_678.0, "exit_share": [0.5, 0.5],
                        "confusion": [[3, 1, 0], [0, 2, 0], [1, 0, 4]]},
            "largest_candidate_static": {"accuracy": 0.93, "mean_macs": 4_000_000.0},
            "static_selection": {"accuracy": 0.90049, "mean_macs": 2_500_000.0},
            "oracle": {"accuracy": 1.0, "mean_macs": 1_200_000.0},
            "each_exit": [{"exit": 1, "accuracy": 0.8, "mean_macs": 1e6},
                          {"exit": 2, "accuracy": 0.9, "mean_macs": 3e6}],
            "vs_largest_candidate": {"macs_share": 0.5864195, "accuracy_gap_points": 1.76549,
                                     "macs_ratio": 1.7053, "throughput_speedup_b256": 1.4567,
                                     "timing_noisy": noisy},
            "baselines": {name: {"accuracy": acc, "mean_macs": macs} for name, acc, macs in (
                ("plain_small", 0.85, 1e6), ("plain_large", 0.88886, 5e6), ("two_cnn_cascade", 0.87774, 3e6),
                ("fixed_cascade", 0.9, 2.4e6), ("fixed_cascade_at_cascade_macs", 0.89, 2.3e6))}}


def test_headline_rounds_and_drops_a_noisy_speedup():
    steady = headline(_results(noisy=False))
    assert steady == {"acc": 0.9123, "mmacs": 2.346, "macs_share": 0.586, "gap_pts": 1.77, "speedup": 1.46,
                      "static_acc": 0.9005, "cnn_acc": 0.8889, "cnn2_acc": 0.8777}
    assert list(steady) == ["acc", "mmacs", "macs_share", "gap_pts", "speedup", "static_acc", "cnn_acc",
                            "cnn2_acc"]
    noisy = headline(_results(noisy=True))
    assert noisy["speedup"] is None and {k: v for k, v in noisy.items() if k != "speedup"} == {
        k: v for k, v in steady.items() if k != "speedup"}


def test_summary_line_says_when_the_timing_was_too_noisy():
    line = summary_line(_results(noisy=False))
    assert line == ("evaluate: cascade 0.9123 at 2,345,678 MACs (exits [0.5, 0.5]); its paths without exits "
                    "0.9300 at 4,000,000; static selection 0.9005 at 2,500,000; oracle 1,200,000 MACs; "
                    "MACs share 0.586, speed-up 1.46x vs MACs ratio 1.71x")
    assert summary_line(_results(noisy=True)) == line + (" (timing too noisy to read: the machine was busy; "
                                                         "headline speedup left out)")


def test_write_evaluation_plots_writes_the_curves_and_the_plots(tmp_path):
    row = lambda acc, macs, t: {"budget_macs": macs, "accuracy": acc, "mean_macs": macs, "thresholds": t}  # noqa: E731
    curves = {"cascade": [row(0.8, 1e6, [0.5]), row(0.9, 2e6, [0.95])],
              "two plain CNNs": [row(0.85, 3e6, [0.123456])]}
    write_evaluation_plots(tmp_path / "plots", _results(noisy=False), curves, ["a", "b", "c"])
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == ["anytime.csv", "anytime.png", "budget_curve.csv", "budget_curve.png", "confusion.png"]
    table = pd.read_csv(tmp_path / "plots" / "budget_curve.csv", dtype={"thresholds": str})
    assert list(table["model"]) == ["cascade", "cascade", "two plain CNNs"]
    assert list(table["thresholds"]) == ["0.5000", "0.9500", "0.1235"]
    assert list(pd.read_csv(tmp_path / "plots" / "anytime.csv")["exit"]) == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots"]  # no temporary left beside it
