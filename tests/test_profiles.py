"""One command from a profile and a data source to a DVC experiment (pipeline.profiles)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.data.sources import check_source
from pipeline.params.config import ConfigError, deep_merge, load_params
from pipeline.params.schema import check_params
from pipeline.profiles import main, profile_overlay, settings

ROOT = Path(__file__).resolve().parents[1]


def test_settings_name_each_leaf_and_add_what_params_lacks() -> None:
    base = {"train": {"epochs": 12, "lr": 0.1}, "modules": {"m1": {"spec": {"channels": 16, "head": "gap"}}}}
    overlay = {"train": {"epochs": 8},
               "modules": {"m1": {"spec": {"channels": 8, "ops": ["conv3", "skip"]}}},
               "data": {"source": "imagefolder:/x y"}}
    assert settings(overlay, base) == ["train.epochs=8", "modules.m1.spec.channels=8",
                                       "+modules.m1.spec.ops=[conv3, skip]", "+data={source: 'imagefolder:/x y'}"]


@pytest.mark.parametrize("profile", ["quick", "tiny"])
def test_every_profile_passes_the_schema_over_the_default_params(profile: str) -> None:
    merged = deep_merge(load_params(ROOT / "params.yaml"), profile_overlay(profile, None, ROOT))
    check_params(merged)


def test_the_quick_profile_keeps_the_modules_epoch_budget_for_the_baselines() -> None:
    merged = deep_merge(load_params(ROOT / "params.yaml"), profile_overlay("quick", None, ROOT))
    epochs = {merged["modules"][k]["train"]["epochs"] for k in merged["modules"]}
    assert epochs == {merged["baselines"]["epochs"]}


def test_dry_run_prints_the_experiment_and_bad_input_stops_first(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["--profile", "quick", "--data", str(tmp_path), "--dry-run"]) == 3  # not a source spec
    assert "data.source must be fashion-mnist" in capsys.readouterr().err
    assert main(["--profile", "quick", "--data", f"imagefolder:{tmp_path}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("running: dvc exp run -S ") and f"-S data.source=imagefolder:{tmp_path}" in out
    with pytest.raises(ConfigError, match="does not exist"):
        check_source(f"imagefolder:{tmp_path / 'missing'}")
    assert main(["--profile", "nope", "--dry-run"]) == 3
    assert "profiles: quick, tiny" in capsys.readouterr().err


def test_run_with_progress_passes_output_through_and_adds_stage_lines(capfd) -> None:
    import sys

    from pipeline.profiles import run_with_progress
    from pipeline.report.progress import StageProgress

    # The child flushes mid-line and pauses, so the pipe hands over a chunk that ends inside a line:
    # the stage's note must still come right after the stage's own line, never inside the next one.
    script = ("import sys, time; sys.stdout.write(\"Running stage 'ingest':\\nepoch 1/2\\repoch 2\"); "
              "sys.stdout.flush(); time.sleep(0.3); print('/2'); "
              "print(\"Stage 'grade' didn't change, skipping\"); raise SystemExit(3)")
    status = run_with_progress([sys.executable, "-c", script], StageProgress(["ingest", "grade"], {}, "soon"))
    out = capfd.readouterr().out
    assert status == 3  # the command's own exit status
    assert "epoch 1/2\repoch 2/2\n" in out and "didn't change, skipping" in out
    note = "[stage 1/2 ingest] elapsed 0 s; no timing of this run here yet (soon in all)"
    assert f"Running stage 'ingest':\n{note}\n" in out


def test_the_last_lines_give_the_verdict_and_the_way_back(tmp_path: Path) -> None:
    """A run on other data says what it chose, whether the shipped cascade is dominated, the registry's
    decision, and, since it replaced the committed results in the workspace, how to get them back."""
    import json
    import subprocess

    from pipeline.profiles import closing_lines

    (tmp_path / "metrics").mkdir()
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "x"]):
        subprocess.run(cmd, cwd=tmp_path, check=True)
    (tmp_path / "metrics" / "ingest.json").write_text(json.dumps({"input": {"reason": "input 3x48x48: ..."}}))
    (tmp_path / "metrics" / "evaluate.json").write_text(json.dumps({"shipped": {
        "accuracy": 0.9, "mean_macs": 2e6, "test_images": 310, "verdict": "DOMINATED: plain_small ..."}}))
    (tmp_path / "metrics" / "register.json").write_text(json.dumps({"model_name": "f-cascade", "version": 3,
                                                                    "passed": False}))
    mine = {"data": {"source": "imagefolder:/x"}}
    assert closing_lines(tmp_path, mine) == [
        "  input             input 3x48x48: ...",
        "  shipped cascade   90.00% at 2.00 M MACs on 310 test images: DOMINATED: plain_small ...",
        "  registry          f-cascade v3 is challenger only"]  # nothing tracked changed yet
    (tmp_path / "params.yaml").write_text("seed: 1\n")
    lines = closing_lines(tmp_path, mine)
    assert "replaced the committed results in this workspace (1 tracked files: params.yaml)" in lines[3]
    assert any("git checkout -- ." in line for line in lines)
    assert len(closing_lines(tmp_path, {"data": {"source": "fashion-mnist"}})) == 3  # the default: no note


FAKE_DVC = """#!/bin/sh
# A stand-in for dvc: lists two stages; `repro` runs the first, skips the second, says which PATH it saw.
case "$1" in
  stage) printf 'ingest\\ngrade\\n' ;;
  repro) echo "Running stage 'ingest':"; echo "PATH=$PATH"; echo "Stage 'grade' didn't change, skipping";
         exit "${FAKE_DVC_STATUS:-0}" ;;
  *) exit 9 ;;
esac
"""


def _fake_dvc(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dvc = folder / "dvc"
    dvc.write_text(FAKE_DVC)
    dvc.chmod(0o755)
    return dvc


def test_dvc_is_found_beside_this_python_then_on_path(tmp_path: Path) -> None:
    from pipeline.profiles import DvcMissing, find_dvc

    venv, elsewhere = tmp_path / "venv" / "bin", tmp_path / "elsewhere"
    _fake_dvc(elsewhere)
    assert find_dvc(str(venv / "python"), path=str(elsewhere)) == str(elsewhere / "dvc")  # none beside: PATH's
    _fake_dvc(venv)
    assert find_dvc(str(venv / "python"), path=str(elsewhere)) == str(venv / "dvc")  # beside wins
    with pytest.raises(DvcMissing, match=r"run `make setup`.*or put the virtualenv's bin on PATH"):
        find_dvc(str(tmp_path / "bare" / "python"), path=str(tmp_path / "empty"))


def _pipeline_in(tmp_path: Path, monkeypatch, python_dir: Path) -> None:
    """Run main() in ``tmp_path`` (its timing record lands there) as if this Python lived in
    ``python_dir``, with a PATH that holds no dvc."""
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "executable", str(python_dir / "python"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")


def test_without_dvc_the_run_stops_with_a_clear_error_not_a_traceback(tmp_path: Path, capsys, monkeypatch) -> None:
    _pipeline_in(tmp_path, monkeypatch, tmp_path / "nowhere")
    assert main(["--params", str(ROOT / "params.yaml"), "--repro"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no dvc beside ") and "make setup" in err and "Traceback" not in err


def test_make_repro_runs_plain_dvc_repro_with_progress_lines(tmp_path: Path, capfd, monkeypatch) -> None:
    """``--repro`` (make repro) runs ``dvc repro`` itself (no experiment), the virtualenv's dvc found beside
    this Python and its folder first on the stages' PATH, with the quick command's progress lines; DVC's
    exit status is the command's."""
    venv = tmp_path / "venv" / "bin"
    _fake_dvc(venv)
    _pipeline_in(tmp_path, monkeypatch, venv)
    assert main(["--params", str(ROOT / "params.yaml"), "--repro"]) == 0
    out = capfd.readouterr().out
    assert out.startswith("running: dvc repro\n")
    assert "Running stage 'ingest':\n[stage 1/2 ingest] elapsed 0 s; no timing of this run here yet" in out
    assert f"PATH={venv}{':'}/usr/bin:/bin\n" in out
    assert "done. Outputs:" in out
    assert (tmp_path / ".cache" / "stage_seconds.json").is_file()  # the next run's estimates
    monkeypatch.setenv("FAKE_DVC_STATUS", "7")
    assert main(["--params", str(ROOT / "params.yaml"), "--repro"]) == 7
    out, err = capfd.readouterr()
    assert "this stage took" in out and "error: dvc repro failed (exit 7)" in err
    with pytest.raises(SystemExit):  # a profile makes an experiment, not a plain repro
        main(["--repro", "--profile", "quick"])
