"""The train stage's workflow called directly on tiny data: module 2 of the routing tests' cascade
planned, trained behind module 1 and finished (pipeline.workflows.train)."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.models.config import ModelConfig
from pipeline.train.config import TrainConfig
from pipeline.workflows.train import TrainInputs, finish_module, module_checkpoints, plan_module, train_planned
from tests.routing.test_assemble import SPEC
from tests.workflows.workflow_data import write_data, write_modules

MODEL = ModelConfig(("m1", "m2", "m3"), SPEC.modules, "maxprob")
CFG = TrainConfig(epochs=1, batch_size=16, lr=0.05, m=2, warmup_epochs=0.0, sandwich=False, min_steps=4)


def inputs(root: Path) -> TrainInputs:
    data = write_data(root / "data")
    models, profile = write_modules(root)
    (root / "graded").mkdir()
    (root / "graded" / "m2.txt").write_text("\n".join(f"train{i}" for i in range(0, 48, 2)) + "\n")
    return TrainInputs(data, root / "graded", profile, root / "latency.json", models, None)


def test_the_plan_resolves_the_recipe_and_keys_each_input(tmp_path: Path) -> None:
    given = inputs(tmp_path)
    plan = plan_module(given, MODEL, CFG, 0, 2, [])
    assert (plan.name, len(plan.subset), plan.soft) == ("m2", 24, None)
    assert plan.cfg.epochs == 4 and plan.notes and "4" in plan.notes[0]  # 24 images / 16: one step an epoch
    assert plan.prefix.mean == plan.info.mean  # m2 inherits m1's normalisation
    assert plan_module(given, MODEL, CFG, 0, 2, []).key == plan.key
    assert plan_module(given, MODEL, CFG, 1, 2, []).key != plan.key  # the seed is in the key


def test_trained_and_finished_the_module_is_written_and_its_checkpoints_go(tmp_path: Path) -> None:
    given = inputs(tmp_path)
    plan = plan_module(given, MODEL, CFG, 0, 2, [])
    out = tmp_path / "out"
    out.mkdir()
    with module_checkpoints(plan, tmp_path, given.models, main=True) as cache:
        module, result = train_planned(plan, cache, torch.device("cpu"), "fp32")
        done = finish_module(plan, module, result, out, 1.0, plan.cfg.epochs, 1, torch.device("cpu"))
        assert list(cache.glob("epoch_*.pt"))  # checkpointed while the block runs
    assert not cache.exists() or not any(cache.iterdir())  # the block ended well: discarded
    assert {"module.pt", "history.csv"} <= {p.name for p in out.iterdir()}
    assert done.metrics["module"] == 2 and done.metrics["epochs"] == 4
    assert done.summary().startswith("train@m2") and done.run_metrics()["module"] == 2
    assert all(p.device.type == "cpu" for p in done.module.parameters())
