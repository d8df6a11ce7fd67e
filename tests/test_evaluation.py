import numpy as np
import torch

from pipeline.evaluation import budget_curve, cascade_summary, target_checks, vs_fixed_cascade
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


def test_budget_curve_ends_at_first_and_last_exit():
    conf = np.array([[0.9, 0.95], [0.4, 0.9], [0.6, 0.7]])
    correct = np.array([[True, True], [False, True], [False, True]])
    cum = np.array([[1.0, 3.0], [1.0, 3.0], [1.0, 3.0]])
    rows = budget_curve(conf, correct, cum, points=11)
    assert rows[0]["mean_macs"] == 1.0 and abs(rows[0]["accuracy"] - 1 / 3) < 1e-12  # t = 0: all leave at exit 1
    assert rows[-1]["mean_macs"] == 3.0 and rows[-1]["accuracy"] == 1.0  # t = 1: nobody leaves early


def _results(cascade_acc: float, cascade_macs: float, fixed_acc: float, fixed_macs: float) -> dict:
    point = lambda a, m: {"accuracy": a, "mean_macs": m}  # noqa: E731
    return {"cascade": point(cascade_acc, cascade_macs),
            "each_exit": [{"exit": 1, **point(0.90, 1.9e6)}],
            "baselines": {"two_cnn_cascade": point(0.92, 8e6), "fixed_cascade": point(fixed_acc, fixed_macs)},
            "candidate_exits": [{"accuracy": 0.91}, {"accuracy": 0.89}],
            "space_largest_static": point(0.93, 9e6), "default_static": point(0.925, 7e6)}


def test_target_checks_read_each_target_off_the_results():
    checks = target_checks(_results(0.931, 3.5e6, 0.927, 3.6e6))
    assert checks["exit1_accuracy_ge_0.895_at_le_2.0M_MACs"]["met"]
    assert checks["cascade_accuracy_ge_0.93"]["met"]
    assert checks["vs_two_cnn_cascade_le_0.5x_macs_at_ge_accuracy"]["met"]
    assert checks["vs_fixed_cascade_0.3pt_at_equal_macs_or_0.8x_macs_at_equal_accuracy"]["met"]  # +0.4 pt
    assert not checks["every_routing_candidate_ge_0.90"]["met"]
    assert checks["space_largest_path_ge_default_path"]["met"]
    worse = target_checks(_results(0.929, 4.5e6, 0.929, 5.0e6))  # equal accuracy at 0.9x MACs: not enough
    assert not worse["cascade_accuracy_ge_0.93"]["met"]
    assert not worse["vs_fixed_cascade_0.3pt_at_equal_macs_or_0.8x_macs_at_equal_accuracy"]["met"]
    assert not worse["vs_two_cnn_cascade_le_0.5x_macs_at_ge_accuracy"]["met"]


def test_vs_fixed_cascade_reads_the_fixed_cascade_held_to_the_cascades_macs():
    point = lambda a, m: {"accuracy": a, "mean_macs": m}  # noqa: E731
    cascade, own = point(0.9264, 2.52e6), point(0.9227, 2.46e6)  # +0.37 pt, but at 1.02x the fixed MACs
    assert not vs_fixed_cascade(cascade, own, None)["met"]
    matched = vs_fixed_cascade(cascade, own, point(0.9230, 2.50e6))  # the fixed cascade at the same cost
    assert matched["met"] and abs(matched["measured_at_equal_macs"][0] - 0.0034) < 1e-9
    assert not vs_fixed_cascade(cascade, own, point(0.9240, 2.50e6))["met"]  # only +0.24 pt at equal MACs
    assert not vs_fixed_cascade(cascade, own, point(0.9200, 2.30e6))["met"]  # not equal MACs: 1.10x
    assert vs_fixed_cascade(point(0.93, 2.0e6), point(0.93, 2.6e6), None)["met"]  # equal accuracy at 0.77x


def test_vs_fixed_cascade_reads_both_budget_curves_at_the_cascades_macs():
    point = lambda a, m: {"accuracy": a, "mean_macs": m}  # noqa: E731
    row = lambda a, m: {"threshold": 0.0, "accuracy": a, "mean_macs": m}  # noqa: E731
    cascade, own = point(0.9304, 2.90e6), point(0.9278, 3.17e6)  # +0.26 pt at 0.91x: not enough alone
    assert not vs_fixed_cascade(cascade, own, None)["met"]
    ours = [row(0.905, 1.95e6), row(0.9289, 2.8e6), row(0.9297, 2.9e6), row(0.9321, 3.2e6)]
    theirs = [row(0.905, 1.95e6), row(0.9240, 2.83e6), row(0.9252, 3.04e6), row(0.9300, 3.46e6)]
    check = vs_fixed_cascade(cascade, own, None, (ours, theirs))
    reading = check["measured_on_budget_curves"]
    assert check["met"] and abs(reading["gain"] - (0.9297 - 0.9240)) < 1e-12  # both read within 2.90 M
    assert abs(reading["macs_ratio_at_equal_accuracy"] - 2.90 / 3.46) < 1e-12  # 92.97% costs it 3.46 M
    close = [row(0.905, 1.95e6), row(0.9280, 2.85e6), row(0.9300, 3.3e6)]  # +0.17 pt, 0.88x: neither
    assert not vs_fixed_cascade(cascade, own, None, (ours, close))["met"]
    never = vs_fixed_cascade(cascade, own, None, (ours, [row(0.90, 3.0e6)]))["measured_on_budget_curves"]
    assert never["fixed_curve"] is None and never["gain"] is None and never["macs_ratio_at_equal_accuracy"] is None
