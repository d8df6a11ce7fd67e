from types import SimpleNamespace

import numpy as np
import torch

from pipeline.evaluation.figures import (
    cascade_summary,
    fitted_curve,
    routing_table,
    target_checks,
    vs_fixed_cascade,
    vs_static_selection,
)
from pipeline.routing.calibration import calib_front
from pipeline.routing.engine import CascadeOutput


def test_cascade_summary_counts():
    out = CascadeOutput(pred=torch.tensor([0, 1, 1, 2]), conf=torch.ones(4), exit_index=torch.tensor([0, 0, 1, 2]),
                        choices=torch.zeros(4, 3, dtype=torch.long), macs=torch.tensor([10, 10, 30, 60]),
                        calls=[4, 2, 1])
    labels = np.array([0, 1, 2, 2])
    s = cascade_summary(out, labels, 3, levels=np.array([1, 1, 2, 3]))
    assert s["accuracy"] == 0.75 and s["mean_macs"] == 27.5
    assert s["exit_share"] == [0.5, 0.25, 0.25]
    assert s["confusion"][2] == [0, 1, 1] and s["per_class_accuracy"] == [1.0, 1.0, 0.5]
    assert s["exit_share_by_level"]["level_1"] == [1.0, 0.0, 0.0]


def test_calib_front_fits_each_budget_on_calib():
    conf = np.array([[0.9, 0.95], [0.4, 0.9], [0.6, 0.7]])
    correct = np.array([[True, True], [False, True], [False, True]])
    cum = np.array([[1.0, 3.0], [1.0, 3.0], [1.0, 3.0]])
    front = calib_front(conf, correct, cum, grid=10, points=11)
    assert front[0]["calib_mean_macs"] == 1.0 and abs(front[0]["calib_accuracy"] - 1 / 3) < 1e-12  # all at exit 1
    assert front[-1]["calib_accuracy"] == 1.0 and abs(front[-1]["calib_mean_macs"] - 7 / 3) < 1e-12  # cheapest perfect
    accs = [r["calib_accuracy"] for r in front]
    assert accs == sorted(accs) and len({tuple(r["thresholds"]) for r in front}) == len(front)
    assert all(r["calib_mean_macs"] <= r["budget_macs"] + 1e-9 for r in front)


def test_fitted_curve_reads_calib_thresholds_on_test():
    calib = (np.array([[0.9, 0.9], [0.4, 0.9]]), np.array([[True, True], [False, True]]),
             np.array([[1.0, 3.0], [1.0, 3.0]]))
    # on test the confident image is wrong at exit 1: a curve chosen on test would not exit it early
    test = (np.array([[0.9, 0.9], [0.4, 0.9]]), np.array([[False, True], [False, True]]),
            np.array([[1.0, 3.0], [1.0, 3.0]]))
    rows = fitted_curve(calib, test, grid=10, points=5)
    best_calib = rows[-1]  # calib's best: image 1 leaves early (right on calib, wrong on test)
    assert best_calib["calib_accuracy"] == 1.0 and best_calib["accuracy"] == 0.5 and best_calib["mean_macs"] == 2.0


def test_a_tie_with_the_static_twin_is_not_a_win():
    point = lambda a, m: {"accuracy": a, "mean_macs": m}  # noqa: E731
    assert not vs_static_selection(point(0.9296, 2.77e6), point(0.9296, 2.77e6))["met"]  # predictor unused
    assert vs_static_selection(point(0.9293, 2.30e6), point(0.9296, 2.77e6))["met"]  # -0.03 pt at 0.83x
    assert not vs_static_selection(point(0.9290, 2.30e6), point(0.9296, 2.77e6))["met"]  # -0.06 pt: not equal
    assert vs_static_selection(point(0.9326, 2.77e6), point(0.9296, 2.77e6))["met"]  # +0.3 pt at equal MACs
    assert not vs_static_selection(point(0.9330, 2.80e6), point(0.9296, 2.77e6))["met"]  # more MACs


def _results(cascade_acc: float, cascade_macs: float, fixed_acc: float, fixed_macs: float) -> dict:
    point = lambda a, m: {"accuracy": a, "mean_macs": m}  # noqa: E731
    return {"cascade": point(cascade_acc, cascade_macs),
            "each_exit": [{"exit": 1, **point(0.90, 1.9e6)}],
            "baselines": {"two_cnn_cascade": point(0.92, 8e6), "fixed_cascade": point(fixed_acc, fixed_macs)},
            "candidate_exits": [{"accuracy": 0.91}, {"accuracy": 0.89}],
            "space_largest_static": point(0.93, 9e6), "default_static": point(0.925, 7e6),
            "static_selection": point(cascade_acc, cascade_macs)}


def test_target_checks_read_each_target_off_the_results():
    checks = target_checks(_results(0.931, 3.5e6, 0.927, 3.6e6))
    assert checks["exit1_accuracy_ge_0.895_at_le_2.0M_MACs"]["met"]
    assert checks["cascade_accuracy_ge_0.93"]["met"]
    assert checks["vs_two_cnn_cascade_le_0.5x_macs_at_ge_accuracy"]["met"]
    assert checks["vs_fixed_cascade_0.3pt_at_equal_macs_or_0.8x_macs_at_equal_accuracy"]["met"]  # +0.4 pt
    assert not checks["every_routing_candidate_ge_0.90"]["met"]
    assert checks["space_largest_path_ge_default_path"]["met"]
    assert not checks["routing_vs_static_selection_equal_acc_at_le_0.85x_macs_or_0.3pt_at_le_macs"]["met"]  # a tie
    worse = target_checks(_results(0.929, 4.5e6, 0.929, 5.0e6))  # equal accuracy at 0.9x MACs: not enough
    assert not worse["cascade_accuracy_ge_0.93"]["met"]
    assert not worse["vs_fixed_cascade_0.3pt_at_equal_macs_or_0.8x_macs_at_equal_accuracy"]["met"]
    assert not worse["vs_two_cnn_cascade_le_0.5x_macs_at_ge_accuracy"]["met"]


def test_the_two_cnn_comparison_is_not_comparable_when_the_baselines_trained_less():
    results = _results(0.931, 3.5e6, 0.927, 3.6e6)
    results["epoch_budget"] = {"baselines": 2, "modules": [8, 8, 6]}  # the tiny profile's budgets
    check = target_checks(results)["vs_two_cnn_cascade_le_0.5x_macs_at_ge_accuracy"]
    assert check["met"] is None and "trained 2 epochs, the modules up to 8" in check["not_comparable"]
    results["epoch_budget"] = {"baselines": 12, "modules": [12, 12, 12]}
    assert target_checks(results)["vs_two_cnn_cascade_le_0.5x_macs_at_ge_accuracy"]["met"] is True


def test_vs_fixed_cascade_reads_the_fixed_cascade_held_to_the_cascades_macs():
    point = lambda a, m: {"accuracy": a, "mean_macs": m}  # noqa: E731
    cascade, own = point(0.9264, 2.52e6), point(0.9227, 2.46e6)  # +0.37 pt, but at 1.02x the fixed MACs
    assert not vs_fixed_cascade(cascade, own, None)["met"]
    matched = vs_fixed_cascade(cascade, own, point(0.9230, 2.50e6))  # the fixed cascade at the same cost
    assert matched["met"] and abs(matched["measured_at_equal_macs"][0] - 0.0034) < 1e-9
    assert not vs_fixed_cascade(cascade, own, point(0.9240, 2.50e6))["met"]  # only +0.24 pt at equal MACs
    assert not vs_fixed_cascade(cascade, own, point(0.9200, 2.30e6))["met"]  # not equal MACs: 1.10x
    assert vs_fixed_cascade(point(0.93, 2.0e6), point(0.93, 2.6e6), None)["met"]  # equal accuracy at 0.77x


def test_routing_table_counts_what_the_cascade_ran():
    path = lambda k: SimpleNamespace(key=lambda: k)  # noqa: E731
    cheap, mid, big = path("cheap"), path("mid"), path("big")
    fixed = SimpleNamespace(candidates=(path(""),), candidate_macs=(5,), predictor=None)
    routed = SimpleNamespace(candidates=(cheap, big), candidate_macs=(10, 30), predictor=object())
    static = SimpleNamespace(candidates=(mid,), candidate_macs=(20,), predictor=None)
    choices = np.array([[0, 0, 0], [0, 1, -1], [0, 1, 0], [0, -1, -1]])
    recorded = [((path(""),), (5,)), ((cheap, big), (10, 30)), ((cheap, big), (10, 30))]
    rows = [{"module": 2, "path": "cheap", "accuracy": 0.9}, {"module": 2, "path": "big", "accuracy": 0.95}]
    table = routing_table([fixed, routed, static], choices, recorded, rows)
    assert [r["module"] for r in table] == [2, 3]  # a fixed module has nothing to route
    two, three = table
    assert two["predictor_used"] and two["images_reaching"] == 3
    assert [(c["path"], c["routed_share"], c["exit_accuracy"]) for c in two["candidates"]] == [
        ("cheap", 1 / 3, 0.9), ("big", 2 / 3, 0.95)]
    assert not three["predictor_used"] and three["images_reaching"] == 2
    assert [(c["path"], c["routed_share"]) for c in three["candidates"]] == [("cheap", 0), ("big", 0), ("mid", 1.0)]


def test_a_noisy_timing_is_flagged():
    from pipeline.evaluation.figures import timing_noisy

    steady = {"throughput_spread": 0.05, "latency_b1_iqr_share": 0.1}
    assert not timing_noisy(steady, steady)
    assert timing_noisy(steady, {"throughput_spread": 0.6, "latency_b1_iqr_share": 0.1})
    # per-image latency varies by design in an early-exit cascade: not noise
    assert not timing_noisy({"throughput_spread": 0.0, "latency_b1_iqr_share": 2.0})
