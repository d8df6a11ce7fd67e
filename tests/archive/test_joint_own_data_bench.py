"""bench/archive/joint_own_data.py on a small hand-made kept run (three modules on 16 px images)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from bench.archive.joint_own_data import exit_accuracies, main, run_stages, train_jointly
from pipeline.io import Split, save_split, write_json
from pipeline.models.modules import ModuleSpec, build_module
from pipeline.models.store import ModuleInfo, load_module, save_module

SPECS = (ModuleSpec("fixed", 4, stride=1, layers=1, head_grid=2, head_hidden=8),
         ModuleSpec("fixed", 8, stride=2, layers=1, head_grid=2, head_hidden=8),
         ModuleSpec("supernet", 8, stride=2, layers=2, ops=("conv3", "skip"), default_op="conv3", head_grid=2,
                    head_hidden=8))
PATH3 = "op@l1=conv3|op@l2=skip"


def _split(name: str, n: int, rng: np.random.Generator) -> Split:
    labels = rng.integers(0, 3, n)
    images = rng.integers(0, 60, (n, 1, 16, 16)).astype(np.uint8)
    for i, label in enumerate(labels):
        images[i, 0, :, label * 5:label * 5 + 5] = 250  # a bright band per class: learnable
    return Split(name, images, labels, np.array([f"{name}{i}" for i in range(n)]))


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("kept") / "scenes-seed0"
    rng = np.random.default_rng(0)
    (run / "data" / "prepared").mkdir(parents=True)
    for name, n in (("train", 128), ("route", 24), ("calib", 24), ("test", 40)):
        save_split(run / "data" / "prepared" / f"{name}.npz", _split(name, n, rng))
    torch.manual_seed(0)
    c = 1
    for k, spec in enumerate(SPECS, start=1):
        d = run / "models" / "modules" / f"m{k}" / "train"
        d.mkdir(parents=True)
        save_module(d, build_module(spec, c, 3), ModuleInfo(k, spec, c, 3, (1, 16, 16), (0.3,), (0.3,)))
        c = spec.channels
    select = run / "models" / "modules" / "m3" / "select"
    select.mkdir(parents=True)
    write_json(select / "selection.json", {"static": PATH3})
    params = {"seed": 0, "modules": {f"m{k}": {"train": {"epochs": 2}} for k in (1, 2, 3)},
              "train": {"epochs": 2, "batch_size": 32, "lr": 0.05, "warmup_epochs": 0.0, "grad_clip": 1.0,
                        "min_steps_hard": 0}}
    (run / "params.yaml").write_text(yaml.safe_dump(params))
    (run / "metrics").mkdir()
    write_json(run / "metrics" / "evaluate.json", {
        "baselines": {"plain_small": {"accuracy": 0.5, "mean_macs": 1.0},
                      "plain_large": {"accuracy": 0.6, "mean_macs": 2.0}},
        "each_exit_alone": [{"exit": k, "accuracy": 0.4, "mean_macs": float(k)} for k in (1, 2, 3)]})
    return run


def test_the_kept_runs_modules_run_on_their_selected_paths(kept_run: Path) -> None:
    modules, archs, first = run_stages(kept_run)
    assert [a.key() for a in archs] == ["", "", PATH3] and first.mean == (0.3,)
    test = np.load(kept_run / "data" / "prepared" / "test.npz")
    acc = exit_accuracies(modules, archs, test["images"], test["labels"], first.mean, first.std)
    # batching does not change an exit's answers: one image at a time gives the same accuracies
    one = [exit_accuracies(modules, archs, test["images"][i:i + 1], test["labels"][i:i + 1], first.mean, first.std)
           for i in range(len(test["labels"]))]
    assert acc == pytest.approx(np.mean(one, axis=0).round(4).tolist(), abs=1e-4)


def test_last_trains_only_through_the_last_exit_and_joint_through_all(kept_run: Path) -> None:
    _, archs, first = run_stages(kept_run)
    torch.manual_seed(0)  # train_jointly's seed, then its reads of the three modules, then the fresh net
    for k in (1, 2, 3):
        load_module(kept_run / "models" / "modules" / f"m{k}" / "train")
    init = build_module(SPECS[0], 1, 3).state_dict()
    last, recipe = train_jointly(kept_run, archs, first, 0, "last")
    joint, _ = train_jointly(kept_run, archs, first, 0, "joint")
    head = [k for k in init if k.startswith("head")]
    assert head and all(torch.equal(last[0].state_dict()[k], init[k]) for k in head)  # no gradient reached it
    assert not all(torch.equal(joint[0].state_dict()[k], init[k]) for k in head)
    assert recipe["steps"] == recipe["epochs"] * (128 // recipe["batch_size"]) and recipe["lr"] == 0.05


def test_the_study_writes_every_exit_for_every_variant(kept_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "joint.json"
    assert main([str(kept_run), "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["runs"]
    assert row["paths"] == ["", "", PATH3] and set(row["recipes"]) == {"joint", "last"}
    for split, n in (("held_out", 48), ("test", 40)):
        assert row[split]["images"] == n
        for name in ("sequential", "joint", "last"):
            assert len(row[split][name]) == 3 and all(0 <= a <= 1 for a in row[split][name])
    assert row["test"]["plain"]["plain_small"]["accuracy"] == 0.5
