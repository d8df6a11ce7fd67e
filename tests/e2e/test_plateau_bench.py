"""bench.plateau on the shared tiny pipeline, in a fresh process as the stage ran (PyTorch's default thread
count): the committed variant reproduces the baselines stage's net, read on the same held-out images."""

from __future__ import annotations

import json
import sys

import pytest

from tests.e2e.conftest import run


def test_the_committed_recipe_reproduces_the_stage(tiny_repo, tmp_path) -> None:
    out = tmp_path / "plateau.json"
    run([sys.executable, "-m", "bench.plateau", "--run", ".", "--net", "plain_small", "--variants", "committed",
         "seed=7", "--out", str(out)], tiny_repo)
    rows = json.loads(out.read_text())["variants"]
    stage = json.loads((tiny_repo / "metrics" / "baselines.json").read_text())
    assert rows["committed"]["held_out"] == pytest.approx(stage["plain_small"]["calib_accuracy"], abs=1e-9)
    assert rows["committed"]["train_acc_by_epoch"][-1][0] == stage["epochs"]
    assert set(rows) == {"committed", "seed=7"}
