"""`train.tries_hard`: on hard data the train stage trains a module from several training seeds and keeps
the one with the highest final training accuracy, which is then exactly what a one-try run at that seed
trains; on data grade did not find hard it trains once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import yaml

from tests.e2e.conftest import env_for


def _train_m1(tiny_repo, out, graded, tries: int, seed: int | None = None) -> subprocess.CompletedProcess:
    params = yaml.safe_load((tiny_repo / "params.yaml").read_text())
    m1 = params["modules"]["m1"].setdefault("train", {}) or {}
    params["modules"]["m1"]["train"] = {**m1, "tries_hard": tries, **({"seed": seed} if seed is not None else {})}
    out.mkdir(parents=True, exist_ok=True)
    (out / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = env_for(tiny_repo) | {"MLFLOW_TRACKING_URI": f"sqlite:///{out / 'mlflow.db'}"}
    cmd = [sys.executable, "-m", "stages.train", "--module", "m1", "--data", "data/prepared", "--graded", str(graded),
           "--profile", "models/profile.json", "--models", str(out / "modules"), "--metrics",
           str(out / "train_m1.json"), "--params", str(out / "params.yaml"), "--root", str(out),
           "--teacher", "models/baselines"]
    return subprocess.run(cmd, cwd=tiny_repo, env=env, capture_output=True, text=True, timeout=600)


def _hard_copy(tiny_repo, tmp_path):
    """The tiny run's grade output with every training image scored as hard as guessing."""
    graded = tmp_path / "graded"
    shutil.copytree(tiny_repo / "data" / "graded", graded)
    lines = (graded / "scores.csv").read_text().splitlines()
    header = lines[0].split(",")
    col = header.index("score")
    rows = [line.split(",") for line in lines[1:]]
    for row in rows:
        row[col] = "1.0"
    (graded / "scores.csv").write_text("\n".join([lines[0], *(",".join(r) for r in rows)]) + "\n")
    return graded


def test_hard_data_keeps_the_best_of_the_tries_and_it_is_that_seeds_own_run(tiny_repo, tmp_path):
    graded = _hard_copy(tiny_repo, tmp_path)
    tried = _train_m1(tiny_repo, tmp_path / "tries", graded, tries=2)
    assert tried.returncode == 0, tried.stdout[-3000:] + tried.stderr[-3000:]
    assert "2 tries (tries_hard: grade found the data hard)" in tried.stdout
    metrics = json.loads((tmp_path / "tries" / "train_m1.json").read_text())
    seeds = [t["train_seed"] for t in metrics["tries"]]
    accuracies = [t["final_train_acc"] for t in metrics["tries"]]
    assert seeds[1] == seeds[0] + 1 and len(seeds) == 2
    kept = metrics["kept_try"]
    assert accuracies[kept] == max(accuracies) and metrics["final_train_acc"] == accuracies[kept]
    assert f"kept try {kept + 1}" in tried.stdout
    assert not list((tmp_path / "tries" / ".cache" / "train").glob("m1-*"))  # every try's checkpoints gone

    alone = _train_m1(tiny_repo, tmp_path / "alone", graded, tries=1, seed=seeds[kept])
    assert alone.returncode == 0, alone.stdout[-3000:] + alone.stderr[-3000:]
    assert "tries" not in json.loads((tmp_path / "alone" / "train_m1.json").read_text())
    module = "modules/m1/train/module.pt"
    assert (tmp_path / "tries" / module).read_bytes() == (tmp_path / "alone" / module).read_bytes()


def test_data_grade_did_not_find_hard_trains_once(tiny_repo, tmp_path):
    result = _train_m1(tiny_repo, tmp_path / "easy", tiny_repo / "data" / "graded", tries=3)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tries" not in result.stdout
    assert "tries" not in json.loads((tmp_path / "easy" / "train_m1.json").read_text())
