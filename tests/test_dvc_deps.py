"""Every DVC stage lists, as deps, every project file its command runs (read from the real import
graph, deferred imports included), so an edit anywhere re-runs exactly the stages that execute it;
and it lists no code it never runs, so an edit elsewhere re-runs nothing. The train stage's
checkpoint key hashes the same files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pipeline.codegraph import (
    ROOT,
    closure,
    code_deps,
    covered,
    missing_code_deps,
    sync_dvc_yaml,
    unused_code_deps,
)


def dvc_stages(path: Path = ROOT / "dvc.yaml") -> dict[str, tuple[str, list[str]]]:
    """Stage name -> (the ``stages.X`` module its cmd runs, its deps), ``foreach`` stages once each
    (their deps are the same for every module but the ``${item...}`` ones)."""
    out = {}
    for name, stage in yaml.safe_load(path.read_text())["stages"].items():
        body = stage.get("do", stage)
        cmd = " ".join(body["cmd"]) if isinstance(body["cmd"], list) else body["cmd"]
        found = re.search(r"python -m (stages\.\w+)", cmd)
        assert found, f"{name}: cmd runs no stages module: {cmd}"
        out[name] = (found.group(1), [d if isinstance(d, str) else next(iter(d)) for d in body.get("deps", [])])
    return out


STAGES = dvc_stages()


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_lists_every_file_it_runs(stage: str) -> None:
    module, deps = STAGES[stage]
    missing = missing_code_deps(module, deps)
    assert not missing, (f"dvc.yaml stage {stage} misses code it runs: {[p.as_posix() for p in missing]}; "
                         f"fix: python -m pipeline.codegraph --sync dvc.yaml")


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_lists_no_code_it_never_runs(stage: str) -> None:
    module, deps = STAGES[stage]
    assert not unused_code_deps(module, deps), f"{stage}: deps on code it never runs re-run it for nothing"


def test_a_missing_dep_is_found() -> None:
    """The check fails on a planted gap: evaluate's deps without the I/O helpers it runs."""
    module, deps = STAGES["evaluate"]
    assert missing_code_deps(module, [d for d in deps if d != "pipeline/io.py"]) == [Path("pipeline/io.py")]
    # the generated list always satisfies the check, and directories cover their files
    assert missing_code_deps(module, code_deps(module)) == []
    assert covered(Path("pipeline/train/loop.py"), ["pipeline/train"])
    assert not covered(Path("pipeline/train_extra.py"), ["pipeline/train"])


def test_an_empty_init_need_not_be_listed_until_it_holds_code(tmp_path: Path) -> None:
    for name, text in {"pipeline/__init__.py": "", "pipeline/lib.py": "X = 1\n", "stages/__init__.py": "",
                       "stages/s.py": "from pipeline.lib import X\n"}.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    assert missing_code_deps("stages.s", ["stages/s.py", "pipeline/lib.py"], tmp_path) == []
    (tmp_path / "pipeline/__init__.py").write_text("import os\n")
    assert missing_code_deps("stages.s", ["stages/s.py", "pipeline/lib.py"], tmp_path) == [Path("pipeline/__init__.py")]


def test_the_two_stale_cases_of_issue_29_rerun() -> None:
    """An edit to ``curriculum_index`` (pipeline/io.py) re-runs train, search, select, calibrate and
    evaluate; an edit to ``teacher_probabilities`` (pipeline/train/baselines.py) re-runs every train stage."""
    for stage in ("ingest", "train", "search", "select", "calibrate", "evaluate"):
        assert covered(Path("pipeline/io.py"), STAGES[stage][1]), stage
    assert covered(Path("pipeline/train/baselines.py"), STAGES["train"][1])


def test_register_lists_the_package_its_model_carries() -> None:
    """register copies all of pipeline/ into the registered model (``mlflow_models._pyfunc_kwargs``)."""
    assert "pipeline" in STAGES["register"][1]


def test_checkpoint_key_hashes_what_train_runs() -> None:
    import stages.train

    assert set(stages.train.CODE) == set(closure("stages.train"))
    assert Path("pipeline/train/baselines.py") in stages.train.CODE and Path("pipeline/io.py") in stages.train.CODE


def test_dvc_yaml_code_lists_are_what_sync_writes() -> None:
    """`python -m pipeline.codegraph --sync dvc.yaml` is the fix the failures above point to: on the
    committed dvc.yaml it changes nothing, and it repairs a stale list while keeping every other line."""
    text = (ROOT / "dvc.yaml").read_text()
    assert sync_dvc_yaml(text) == text, "run: python -m pipeline.codegraph --sync dvc.yaml"
    stale = text.replace("        - pipeline/routing/assemble.py\n", "        - pipeline/old_gone.py\n", 1)
    assert stale != text and sync_dvc_yaml(stale) == text
