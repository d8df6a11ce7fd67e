"""bench/anchors.py and bench/module_shapes.py on a tiny run built by hand: the field's nets and candidate
first modules trained at the run's recipe and step budget, read on its test split, and plotted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from bench import anchors, module_shapes
from pipeline.io import Split, save_split, write_json


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run's files, as bench.anchors reads them: 2 classes of 12 px grey images told apart by
    brightness, the baselines recipe at 2 epochs, and an evaluate record with the cascade's rows."""
    root = tmp_path_factory.mktemp("run")
    prepared = root / "data" / "prepared"
    prepared.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, n in (("train", 256), ("test", 64), ("route", 32), ("calib", 32)):
        labels = np.arange(n) % 2
        images = (rng.integers(0, 80, (n, 1, 12, 12)) + 120 * labels[:, None, None, None]).astype(np.uint8)
        save_split(prepared / f"{name}.npz", Split(name, images, labels, np.array([f"{name}{i}" for i in range(n)])))
    write_json(prepared / "meta.json", {"source": "tiny", "classes": ["dark", "bright"]})
    (root / "params.yaml").write_text(yaml.safe_dump({"baselines": {"epochs": 1, "batch_size": 32}}))
    row = {"accuracy": 0.9, "mean_macs": 1e5}
    write_json(root / "metrics" / "baselines.json", {"epochs": 2})
    write_json(root / "metrics" / "evaluate.json", {
        "cascade": row, "each_exit_alone": [{"exit": 1, **row}],
        "budget_curves": {"cascade": [row, {"accuracy": 0.95, "mean_macs": 2e5}]},
        "baselines": {"plain_small": row, "plain_large": row}})
    return root


def test_an_anchor_is_trained_at_plain_larges_step_budget_and_read_on_test(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "anchors.json"
    assert anchors.main(["--run", str(run), "--anchors", "resnet18@8", "--out", str(out), "--threads", "1"]) == 0
    (row,) = json.loads(out.read_text())["anchors"]
    assert row["name"] == "resnet18@8" and row["epochs"] == 2 and row["steps"] == 2 * (256 // 32)
    assert row["mean_macs"] == row["flop_counter_macs"] > 0 and row["test_images"] == 64
    assert row["held_out_images"] == 64 and 0.5 < row["held_out_accuracy"] <= 1.0  # route + calib: what to choose on
    assert 0.5 < row["accuracy"] <= 1.0  # brightness is easy: far above chance after 16 steps
    assert row["se"] == pytest.approx(np.sqrt(row["accuracy"] * (1 - row["accuracy"]) / 64))
    before = out.read_text()
    anchors.main(["--run", str(run), "--anchors", "resnet18@8", "--out", str(out)])
    assert json.loads(out.read_text())["anchors"] == json.loads(before)["anchors"]  # kept, not trained again
    anchors.main(["--plot", str(out), "--png", str(tmp_path / "a.png")])
    assert (tmp_path / "a.png").stat().st_size > 0


def test_a_bad_anchor_name_is_refused_by_name(run: Path) -> None:
    with pytest.raises(SystemExit, match="'vgg@1' is not ARCH@WIDTH"):
        anchors.main(["--run", str(run), "--anchors", "vgg@1"])


def test_a_candidate_first_module_is_read_like_an_anchor(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "shapes.json"
    assert module_shapes.main(["c8s2:dw3,dw3", "--run", str(run), "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["shape"] == "c8s2:dw3,dw3" and row["mean_macs"] == row["flop_counter_macs"] > 0
    assert module_shapes.main(["c8s1:maxpool,conv3,maxpool,conv3", "--run", str(run), "--out", str(out)]) == 0
    pooled = json.loads(out.read_text())["rows"][-1]
    assert pooled["shape"] == "c8s1:maxpool,conv3,maxpool,conv3" and pooled["mean_macs"] == pooled["flop_counter_macs"]
    with pytest.raises(SystemExit, match="is not c<channels>s<stride>"):
        module_shapes.main(["8s2", "--run", str(run), "--out", str(out)])
