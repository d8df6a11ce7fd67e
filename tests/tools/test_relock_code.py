"""scripts/relock_code.py: dvc.lock is current for the code, and a code edit re-records only its entries."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from bench.own_data import working_copy

ROOT = Path(__file__).resolve().parents[2]


def _relock_module():
    spec = importlib.util.spec_from_file_location("relock_code", ROOT / "scripts" / "relock_code.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return working_copy(tmp_path_factory.mktemp("relock"))


def test_committed_lock_is_current_for_the_code(copy: Path) -> None:
    # Outputs and data are absent here, so only code and params entries can move: none may.
    assert _relock_module().relock(copy) == []


def test_a_code_edit_re_records_only_its_own_entries(copy: Path) -> None:
    target = "pipeline/models/config.py"
    lock = yaml.safe_load((copy / "dvc.lock").read_text())
    listing = {stage for stage, body in lock["stages"].items()
               if any(entry["path"] == target for entry in body.get("deps", []))}
    assert listing, f"no stage lists {target}"
    with open(copy / target, "a") as f:
        f.write("# an edit that computes nothing\n")
    changed = _relock_module().relock(copy)
    assert {(stage, "deps", target) for stage in listing} <= set(changed)
    # the file itself, or a directory holding it (train lists pipeline/models, register pipeline)
    assert all(kind == "deps" and (path == target or target.startswith(path + "/"))
               for _, kind, path in changed), changed


def test_a_new_dependency_gets_the_hash_its_producing_stage_recorded(copy: Path) -> None:
    dvc_yaml = copy / "dvc.yaml"
    text = dvc_yaml.read_text()
    anchor = "      - metrics/evaluate.json\n"
    assert text.count(anchor) == 1, "register's dependency on evaluate's metrics moved: update this test"
    dvc_yaml.write_text(text.replace(anchor, anchor + "      - models/baselines\n"))
    changed = _relock_module().relock(copy)
    assert ("register", "deps", "models/baselines") in changed
    lock = yaml.safe_load((copy / "dvc.lock").read_text())["stages"]
    produced = next(e for e in lock["baselines"]["outs"] if e["path"] == "models/baselines")
    dep = next(e for e in lock["register"]["deps"] if e["path"] == "models/baselines")
    assert (dep["hash"], dep["md5"], dep["size"]) == ("md5", produced["md5"], produced["size"])
