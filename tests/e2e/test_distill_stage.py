"""`train.kd > 0`: the train stage distils from the baselines' plain CNN more accurate on calib given
`--teacher`, says which, and refuses to run without one (no silent fallback to plain training)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import yaml

from tests.e2e.conftest import env_for


def _train_m2(tiny_repo, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    params = yaml.safe_load((tiny_repo / "params.yaml").read_text())
    params["train"].update(kd=1.0, kd_temperature=2.0)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    models = tmp_path / "modules"
    if not (models / "m1").exists():
        shutil.copytree(tiny_repo / "models" / "modules" / "m1", models / "m1")
    env = env_for(tiny_repo) | {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    cmd = [sys.executable, "-m", "stages.train", "--module", "m2", "--data", "data/prepared", "--graded", "data/graded",
           "--profile", "models/profile.json", "--models", str(models), "--metrics", str(tmp_path / "train_m2.json"),
           "--params", str(tmp_path / "params.yaml"), "--root", str(tmp_path), *extra]
    return subprocess.run(cmd, cwd=tiny_repo, env=env, capture_output=True, text=True, timeout=600)


def test_train_stage_distils_from_the_teacher_and_needs_one(tiny_repo, tmp_path):
    refused = _train_m2(tiny_repo, tmp_path)
    assert refused.returncode != 0
    assert "--teacher" in refused.stderr and "kd" in refused.stderr
    assert not (tmp_path / "modules" / "m2").exists() and not (tmp_path / "train_m2.json").exists()

    result = _train_m2(tiny_repo, tmp_path, "--teacher", "models/baselines")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    calib = json.loads((tiny_repo / "models" / "baselines" / "baselines.json").read_text())["calib"]
    teacher = max(("plain_large", "plain_small"), key=lambda n: calib[n]["calib_accuracy"])  # a tie: plain_large
    assert f"train@m2: distilled from {teacher} (calib accuracy" in result.stdout, result.stdout[-3000:]
    metrics = json.loads((tmp_path / "train_m2.json").read_text())
    plain = json.loads((tiny_repo / "metrics" / "train_m2.json").read_text())
    assert metrics["kd"] == 1.0 and plain.get("kd", 0.0) == 0.0
    assert (tmp_path / "modules" / "m2" / "train" / "module.pt").is_file()
    # the teacher changed what was learned: other weights than the plain run's, and a working exit
    distilled = (tmp_path / "modules" / "m2" / "train" / "module.pt").read_bytes()
    assert distilled != (tiny_repo / "models" / "modules" / "m2" / "train" / "module.pt").read_bytes()
    assert metrics["calib_exit_acc"] > 0.3  # digits: 10 classes, chance is 0.1
