"""The seeds summary (bench.seeds): per figure each seed's value, mean and spread; targets per seed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.seeds import summarise


def _metrics(acc: float, candidates: list[float], met: bool) -> dict:
    row = {"accuracy": acc, "mean_macs": 2.0e6}
    return {"cascade": row, "each_exit": [row, row],
            "baselines": {"fixed_cascade": row, "fixed_cascade_at_cascade_macs": row,
                          "two_cnn_cascade": row, "plain_large": row},
            "candidate_exits": [{"accuracy": a} for a in candidates],
            "targets": {"cascade_accuracy_ge_0.93": {"measured": acc, "met": met}}}


def test_summary_reads_mean_spread_and_targets_of_each_seed(tmp_path: Path) -> None:
    runs = {0: _metrics(0.93, [0.92, 0.91], True), 2: _metrics(0.925, [], False)}
    for seed, m in runs.items():
        (tmp_path / f"seed_{seed}.json").write_text(json.dumps(m))
    summary = summarise(sorted(tmp_path.glob("seed_*.json")))
    assert summary["seeds"] == [0, 2]
    cascade = summary["figures"]["cascade accuracy"]
    assert cascade["values"] == {0: 0.93, 2: 0.925}
    assert cascade["mean"] == pytest.approx(0.9275) and cascade["spread"] == pytest.approx(0.005)
    worst = summary["figures"]["worst routing candidate accuracy"]["values"]
    assert worst[0] == 0.91 and math.isnan(worst[2])  # seed 2 scored no candidate
    assert summary["targets"] == {"cascade_accuracy_ge_0.93": {0: True, 2: False}}
