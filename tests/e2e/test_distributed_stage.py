"""`train.processes: 2`: the train stage relaunches itself under torchrun (2 gloo ranks on this CPU)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import yaml

from tests.e2e.conftest import env_for


def test_train_stage_with_two_processes_under_torchrun(tiny_repo, tmp_path):
    params = yaml.safe_load((tiny_repo / "params.yaml").read_text())
    params["train"]["processes"] = 2
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    models = tmp_path / "modules"
    shutil.copytree(tiny_repo / "models" / "modules" / "m1", models / "m1")
    env = env_for(tiny_repo) | {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    cmd = [sys.executable, "-m", "stages.train", "--module", "m2", "--data", "data/prepared", "--graded", "data/graded",
           "--profile", "models/profile.json", "--models", str(models), "--metrics", str(tmp_path / "train_m2.json"),
           "--params", str(tmp_path / "params.yaml")]
    result = subprocess.run(cmd, cwd=tiny_repo, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "torch.distributed.run" in result.stdout and "--nproc-per-node=2" in result.stdout
    two = json.loads((tmp_path / "train_m2.json").read_text())
    one = json.loads((tiny_repo / "metrics" / "train_m2.json").read_text())
    assert two["processes"] == 2 and one.get("processes", 1) == 1
    assert (models / "m2" / "train" / "module.pt").is_file()
    assert (models / "m2" / "train" / "prob_model.json").is_file()
    # Per-rank BatchNorm statistics (tests/train/test_distributed.py): close to, not equal to, one process.
    assert abs(two["calib_exit_acc"] - one["calib_exit_acc"]) < 0.15
    cache = tiny_repo / ".cache" / "train"
    assert not (cache.is_dir() and list(cache.glob("m2-*")))  # the checkpoint folder is removed on success
