"""Stages run again on the same inputs give byte-identical DVC outputs (timings live only in metrics
files). The full check, two whole runs from scratch, is `python -m tests.tools.rerun_determinism` (12 min);
this test re-runs the two stages whose outputs once carried run-specific bytes (GX data docs with the
run's time in validate, the baselines' training seconds) and checks the whole dvc.lock."""

from __future__ import annotations

import shutil

import yaml

from tests.e2e.conftest import run
from tests.tools.rerun_determinism import compare_locks


def test_forced_rerun_of_validate_and_baselines_changes_no_output(tiny_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo, symlinks=True)
    before = yaml.safe_load((repo / "dvc.lock").read_text())
    for stage in ("validate", "baselines"):
        run(["dvc", "repro", "-f", "-s", stage], repo)
    after = yaml.safe_load((repo / "dvc.lock").read_text())
    result = compare_locks(before, after)
    assert not result["differ"] and not result["only_one"], result
    assert ("baselines", "models/baselines") in result["equal"]
    assert ("validate", "reports/validation") in result["equal"]
    assert (repo / "reports" / "data_docs" / "index.html").is_file()
