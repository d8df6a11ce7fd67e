import numpy as np
import torch

from pipeline.evaluation import budget_curve, cascade_summary
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
