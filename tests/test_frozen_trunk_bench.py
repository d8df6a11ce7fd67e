"""bench/frozen_trunk.py on a tiny run built by hand: tails behind the run's frozen module 1, the same nets
trained end to end, and module 1 retrained with a look-ahead tail, each read on held-out and test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from bench import frozen_trunk
from pipeline.io import Split, save_split, write_json
from pipeline.models.modules import FixedModule, ModuleSpec
from pipeline.models.store import ModuleInfo, save_module


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 classes of 12 px grey images told apart by brightness, a 2-epoch recipe, and an untrained module 1
    saved as train@m1 saves it (4 channels, one pool: the trunk t4s1,p,c)."""
    root = tmp_path_factory.mktemp("run")
    prepared = root / "data" / "prepared"
    prepared.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, n in (("train", 128), ("test", 32), ("route", 16), ("calib", 16)):
        labels = np.arange(n) % 2
        images = (rng.integers(0, 80, (n, 1, 12, 12)) + 120 * labels[:, None, None, None]).astype(np.uint8)
        save_split(prepared / f"{name}.npz", Split(name, images, labels, np.array([f"{name}{i}" for i in range(n)])))
    write_json(prepared / "meta.json", {"source": "tiny", "classes": ["dark", "bright"]})
    (root / "params.yaml").write_text(yaml.safe_dump({"baselines": {"epochs": 1, "batch_size": 32}}))
    write_json(root / "metrics" / "baselines.json", {"epochs": 2})
    spec = ModuleSpec("fixed", 4, layers=1, pools=1)
    torch.manual_seed(0)
    module = FixedModule(spec, 1, 2)
    directory = root / "models" / "modules" / "m1" / "train"
    directory.mkdir(parents=True)
    save_module(directory, module, ModuleInfo(1, spec, 1, 2, (1, 12, 12), (0.5,), (0.25,)))
    return root


def test_every_row_is_read_and_the_frozen_module_1_is_left_as_it_was(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "frozen.json"
    args = ["--run", str(run), "--trunk", "t4s1,p,c", "--tails", "t8s2,c", "t8s1,c", "--out", str(out)]
    assert frozen_trunk.main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    names = [r["row"].split(":")[0] for r in rows]
    assert names == ["behind the run's module 1", "end to end, one exit"] * 2 + [
        "module 1 with a look-ahead tail (exit loss x 1)"] + ["behind that module 1, a fresh tail"] * 2 + [
        "the run's module 1 trained on with a look-ahead tail (exit loss x 1)"] + [
        "behind that module 1, a fresh tail"] * 2
    for row in rows:
        assert len(row["held_out"]) == len(row["test"]) == len(row["macs"]) == 2
        assert all(0.0 <= a <= 1.0 for a in row["held_out"] + row["test"]) and min(row["macs"]) > 0
        assert row["held_out_images"] == 32 and row["test_images"] == 32
    behind = [r for r in rows if r["row"].startswith("behind the run's")]
    assert behind[0]["held_out"][0] == behind[1]["held_out"][0]  # module 1 frozen: exit 1 unchanged by a tail
    for look, fresh in ((rows[4], rows[5:7]), (rows[7], rows[8:10])):  # each retrained module 1, then frozen
        assert fresh[0]["held_out"][0] == fresh[1]["held_out"][0] == look["held_out"][0]
        assert look["test"][1] > 0.6  # brightness is easy: the look-ahead tail learns it in 8 steps
    only = tmp_path / "only.json"
    assert frozen_trunk.main([*args[:-2], "--out", str(only), "--finetune-only"]) == 0
    assert [r["row"] for r in json.loads(only.read_text())["rows"]] == [r["row"] for r in rows[7:]]
    control = tmp_path / "control.json"
    assert frozen_trunk.main([*args[:-2], "--out", str(control), "--finetune-only", "--control"]) == 0
    first, *fresh = json.loads(control.read_text())["rows"]
    assert first["row"] == "the run's module 1 trained on alone, as long (control)" and len(first["held_out"]) == 1
    assert [r["held_out"][0] for r in fresh] == [first["held_out"][0]] * 2  # the tails sit behind that module 1


def test_a_bad_net_is_refused_by_token(run: Path) -> None:
    with pytest.raises(SystemExit, match="'x3' in 't4s1,x3' is not"):
        frozen_trunk.main(["--run", str(run), "--trunk", "t4s1,x3"])
