"""dvc.yaml grows with the cascade: its train/search/select stages loop over params `modules`, each
module's `after` names what its train stage depends on, and the params check keeps that consistent."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.params.config import load_params
from pipeline.params.schema import module_after, params_problems

ROOT = Path(__file__).resolve().parents[1]
PARAMS = load_params(ROOT / "params.yaml")


def with_modules(n: int) -> dict:
    """params.yaml with modules m1..mn (extra modules: plain copies of the last one, stride 1)."""
    params = copy.deepcopy(PARAMS)
    mods = params["modules"]
    for k in range(len(mods) + 1, n + 1):
        mods[f"m{k}"] = {"after": module_after(k),
                         "spec": {"kind": "fixed", "channels": 16, "stride": 1, "layers": 1}}
    for k in range(n + 1, len(mods) + 1):
        del mods[f"m{k}"]
    params["grade"]["levels"] = max(params["grade"]["levels"], n)
    return params


def test_shipped_modules_name_what_they_stack_on():
    assert [m["after"] for m in PARAMS["modules"].values()] == [module_after(k) for k in
                                                                range(1, len(PARAMS["modules"]) + 1)]
    assert module_after(1) == "data/prepared" and module_after(4) == "models/modules/m3"


@pytest.mark.parametrize("n", [1, 2, 4, 5])
def test_any_number_of_modules_passes(n):
    assert params_problems(with_modules(n)) == []


def test_after_missing_wrong_or_on_a_missing_module():
    params = with_modules(4)
    del params["modules"]["m4"]["after"]
    assert params_problems(params) == [
        "modules.m4.after is missing: write `after: models/modules/m3` (module m3, what m4 stacks on)"]
    assert params_problems(params, partial=True) == []  # a stage run by hand does not read it
    params["modules"]["m4"]["after"] = "models/modules/m2"
    assert params_problems(params, partial=True) == [
        "modules.m4.after must be 'models/modules/m3' (modules run in series: write "
        "`after: models/modules/m3` (module m3, what m4 stacks on)), got 'models/modules/m2'"]
    params["modules"]["m4"]["after"] = "models/modules/m7"
    (problem,) = params_problems(params)
    assert problem.startswith("modules.m4.after stacks m4 on module m7, which is not in "
                              "['m1', 'm2', 'm3', 'm4']")
    params = with_modules(3)
    params["modules"]["m1"]["after"] = "models/modules/m1"
    (problem,) = params_problems(params)
    assert problem.startswith("modules.m1.after must be 'data/prepared'")


def test_check_params_cli_names_the_bad_after(tmp_path):
    params = with_modules(4)
    params["modules"]["m4"]["after"] = "models/modules/m9"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    cmd = [sys.executable, "-m", "pipeline.check_params", "--params", str(tmp_path / "params.yaml")]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 3 and "modules.m4.after stacks m4 on module m9" in result.stderr


DVC = shutil.which("dvc", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(DVC is None, reason="dvc not installed")
@pytest.mark.parametrize("n", [2, 4])
def test_dvc_yaml_has_module_stages_for_each_key_of_params_modules(tmp_path, n):
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(with_modules(n), sort_keys=False))
    env = {**os.environ, "DVC_NO_ANALYTICS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=tmp_path, env=env, check=True)
    listed = subprocess.run(["dvc", "stage", "list", "--name-only"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, check=True).stdout.split()
    keys = [f"m{k}" for k in range(1, n + 1)]
    for stage in ("train", "search", "select"):
        assert sorted(s for s in listed if s.startswith(f"{stage}@")) == [f"{stage}@{k}" for k in keys]
    # what every stage reads, per module: its own key, outputs and metrics names stay m1, m2, ...
    dvc = yaml.safe_load((tmp_path / "dvc.yaml").read_text())
    assert dvc["stages"]["train"]["foreach"] == "${modules}"
    edges = subprocess.run(["dvc", "dag", "--dot"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           check=True).stdout
    for k in range(2, n + 1):  # module k stacks on k-1: its train, search and select outputs
        for stage in ("train", "search", "select"):
            assert f'"{stage}@m{k - 1}" -> "train@m{k}"' in edges
    for k in keys:  # calibrate depends on every module's outputs (the models/modules directory)
        assert f'"select@{k}" -> "calibrate"' in edges
