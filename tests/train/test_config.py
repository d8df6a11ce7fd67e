"""The training config's epoch floor (pipeline.train.config: ``min_steps``): small data gets enough
optimiser steps, large data keeps its configured epochs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.params.schema import params_problems
from pipeline.train.baselines import BaselineConfig
from pipeline.train.config import (
    TrainConfig,
    epochs_for,
    epochs_note,
    sized_to,
    step_floor,
)
from pipeline.train.outputs import epochs_trained


@pytest.mark.parametrize(("epochs", "min_steps", "images", "batch", "want"), [
    (8, 600, 1707, 64, 24),       # a 2,000-image folder: 26 steps an epoch, 8 epochs are 208 steps
    (12, 600, 54000, 256, 12),    # Fashion-MNIST: 210 steps an epoch, the floor does not bite
    (8, 0, 100, 64, 8),           # off
    (2, 10, 30, 64, 10),          # fewer images than a batch: one (partial) step an epoch
    (3, 601, 6400, 64, 7),        # rounds up: 6 epochs are 600 steps
])
def test_epochs_for_raises_epochs_to_the_step_floor_only(epochs: int, min_steps: int, images: int, batch: int,
                                                         want: int) -> None:
    assert epochs_for(epochs, min_steps, images, batch) == want
    assert want * max(1, images // batch) >= min_steps


def test_sized_configs_keep_everything_but_the_epochs() -> None:
    cfg = TrainConfig(epochs=8, batch_size=64, lr=0.05, min_steps=600, grad_clip=1.0)
    sized = sized_to(cfg, 1707)
    assert (sized.epochs, sized.min_steps, sized.grad_clip, sized.lr) == (24, 600, 1.0, 0.05)
    assert sized_to(sized, 1707) == sized  # idempotent: a resumed run derives the same config
    base = BaselineConfig(epochs=8, batch_size=64, min_steps=600)
    assert base.sized_to(1280).epochs == 30 and base.sized_to(1280).train_config(0).epochs == 30
    assert BaselineConfig(epochs=8).sized_to(1280).epochs == 8  # min_steps 0 by default
    assert epochs_note("baselines", 8, 30, 600, 1280, 64) == (
        "baselines: 8 epochs of 1,280 images are 160 steps at batch 64, under min_steps 600: training 30 epochs")


def test_min_steps_is_checked_by_the_schema() -> None:
    problems = "\n".join(params_problems({"train": {"epochs": 2, "batch_size": 8, "lr": 0.1, "min_steps": -1},
                                           "baselines": {"min_steps": "many"}}, partial=True))
    assert "train.min_steps" in problems and "baselines.min_steps" in problems


def test_epochs_trained_counts_the_history_rows(tmp_path: Path) -> None:
    (tmp_path / "history.csv").write_text("epoch,loss\n1,2.0\n2,1.5\n3,1.2\n")
    assert epochs_trained(tmp_path) == 3


def test_hard_data_raises_the_floor_to_min_steps_hard_only_where_set() -> None:
    cfg = TrainConfig(epochs=8, batch_size=64, lr=0.05, min_steps=600, min_steps_hard=1200)
    assert step_floor(600, 1200, hard=True) == 1200 and step_floor(600, 1200, hard=False) == 600
    assert step_floor(600, 0, hard=True) == 600  # unset: the hard floor never lowers the floor
    assert step_floor(600, 300, hard=True) == 600
    assert sized_to(cfg, 1707).epochs == 24 and sized_to(cfg, 1707, hard=True).epochs == 47  # 26 steps an epoch
    base = BaselineConfig(epochs=8, batch_size=64, min_steps=600, min_steps_hard=1200)
    assert (base.sized_to(1280).epochs, base.sized_to(1280, hard=True).epochs) == (30, 60)
    assert base.floor(True) == 1200 and BaselineConfig(min_steps=600).floor(True) == 600
    assert epochs_note("train@m1", 8, 47, 1200, 1707, 64, hard=True).endswith(
        "under min_steps_hard 1,200 (grade found the data hard): training 47 epochs")
    problems = "\n".join(params_problems({"baselines": {"min_steps_hard": -5}}, partial=True))
    assert "baselines.min_steps_hard" in problems


@pytest.mark.parametrize("retired", ["kd_hard", "tries_hard"])
def test_the_retired_hard_data_options_are_refused_by_name(retired: str) -> None:
    # docs/DESIGN.md "Distillation on hard data too", "One training of module 1 on hard data"
    problems = "\n".join(params_problems({"train": {retired: 1}}, partial=True))
    assert f"train.{retired} is not a known key (retired: " in problems
    problems = "\n".join(params_problems({"modules": {"m1": {"train": {retired: 1}}}}, partial=True))
    assert f"modules.m1.train.{retired} is not a known key (retired: " in problems
    # a key of the same name elsewhere is only unknown
    assert "retired" not in "\n".join(params_problems({"grade": {retired: 1}}, partial=True))
    with pytest.raises(ValueError, match=retired):
        TrainConfig.from_dict({"epochs": 8, "batch_size": 64, "lr": 0.05, retired: 1})


