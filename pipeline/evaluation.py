"""Evaluation figures of a cascade and its baselines on one labelled split (pure functions over the
engine's outputs, plus the timing helpers). The evaluate stage is the only reader of the test split."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pipeline.routing.calibration import oracle, simulate_thresholds
from pipeline.routing.engine import CascadeOutput, Stage, run_all_exits, run_cascade


def cascade_summary(out: CascadeOutput, labels: np.ndarray, n_classes: int, levels: np.ndarray | None) -> dict:
    """Accuracy, mean MACs, exit distribution, per-class accuracy, confusion, exit rate per level."""
    pred, exits, macs = out.pred.numpy(), out.exit_index.numpy(), out.macs.numpy()
    k = len(out.calls)
    confusion = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(confusion, (labels, pred), 1)
    per_class = (np.diag(confusion) / np.maximum(confusion.sum(1), 1)).round(4).tolist()
    summary: dict[str, Any] = {
        "accuracy": float((pred == labels).mean()),
        "mean_macs": float(macs.mean()),
        "exit_share": (np.bincount(exits, minlength=k) / len(exits)).round(4).tolist(),
        "module_calls": list(out.calls),
        "per_class_accuracy": per_class,
        "confusion": confusion.tolist(),
    }
    if levels is not None:
        summary["exit_share_by_level"] = {
            f"level_{lv}": (np.bincount(exits[levels == lv], minlength=k) / max(1, (levels == lv).sum())).round(4).tolist()
            for lv in np.unique(levels)}
    return summary


def all_exit_figures(stages: Sequence[Stage], x: torch.Tensor, labels: np.ndarray, kind: str) -> dict[str, Any]:
    """Each exit alone (accuracy, mean MACs to reach it), the oracle, and the arrays for curves."""
    outs = run_all_exits(stages, x, confidence_kind=kind, batch_size=512)
    correct = (outs["pred"].numpy() == labels[:, None])
    cum = outs["cum_macs"].numpy().astype(np.float64)
    o_acc, o_macs = oracle(correct, cum)
    return {"exits": [{"exit": j + 1, "accuracy": float(correct[:, j].mean()), "mean_macs": float(cum[:, j].mean())}
                      for j in range(correct.shape[1])],
            "oracle": {"accuracy": float(o_acc), "mean_macs": float(o_macs)},
            "_conf": outs["conf"].numpy(), "_correct": correct, "_cum": cum}


def budget_curve(conf: np.ndarray, correct: np.ndarray, cum: np.ndarray, points: int = 41) -> list[dict]:
    """Accuracy vs mean MACs when every exit but the last uses the same threshold t, t in [0, 1]."""
    rows = []
    for t in np.linspace(0.0, 1.0, points):
        thresholds = [float(t)] * (conf.shape[1] - 1)
        acc, macs, _ = simulate_thresholds(conf, correct, cum, thresholds)
        rows.append({"threshold": float(t), "accuracy": float(acc), "mean_macs": float(macs)})
    return rows


def time_cascade(stages: Sequence[Stage], x: torch.Tensor, kind: str, *, batch1_images: int,
                 big_batch: int, repeats: int = 3) -> dict[str, float]:
    """Wall clock of the real engine: median ms per image at batch 1, and images/s at ``big_batch``."""
    singles = []
    for i in range(min(batch1_images, len(x))):
        start = time.perf_counter()
        run_cascade(stages, x[i:i + 1], confidence_kind=kind)
        singles.append((time.perf_counter() - start) * 1e3)
    run_cascade(stages, x[:big_batch], confidence_kind=kind)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run_cascade(stages, x, confidence_kind=kind, batch_size=big_batch)
        best = min(best, time.perf_counter() - start)
    return {"latency_ms_b1_median": statistics.median(singles), "throughput_b%d" % big_batch: len(x) / best}
