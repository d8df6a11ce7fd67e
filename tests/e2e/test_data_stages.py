"""Real `dvc repro` of the pipeline on the tiny profile, in a temporary copy of the repository."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.e2e.conftest import changed_stages, repo_env, run

pytestmark = pytest.mark.e2e


def test_outputs_metrics_plots_and_docs(tiny_repo):
    for path in ("data/prepared/train.npz", "data/prepared/meta.json", "reports/validation/summary.json",
                 "reports/data_docs/index.html", "data/graded/scores.csv", "data/graded/m3.txt",
                 "data/graded/grader.npz", "plots/grade/score_hist.png", "plots/grade/examples.png"):
        assert (tiny_repo / path).exists(), path
    grade = json.loads((tiny_repo / "metrics/grade.json").read_text())
    means = [lv["mean_score"] for lv in grade["levels"]]
    assert means == sorted(means) and len(means) == 4  # the shared repo's cascade has 4 modules
    # the one DVC metrics file is the headline (narrow `dvc metrics show` / `dvc exp show`); the stages'
    # full metrics JSON are plain uncached outputs
    shown = run(["dvc", "metrics", "show"], tiny_repo).stdout
    assert "metrics/headline.json" in shown and "acc" in shown
    assert "metrics/grade.json" not in shown and "metrics/ingest.json" not in shown


def dag_edges(repo) -> set[tuple[str, str]]:
    """Edges of `dvc dag` as (upstream, downstream) stage names, read from its mermaid output."""
    lines = [line.strip() for line in run(["dvc", "dag", "--md"], repo).stdout.splitlines()]
    names = {line.split("[")[0]: line.split('"')[1] for line in lines if '["' in line}
    return {(names[a], names[b]) for a, b in (line.split("-->") for line in lines if "-->" in line)}


def test_dag_order(tiny_repo):
    edges = dag_edges(tiny_repo)
    assert ("ingest", "validate") in edges and ("validate", "grade") in edges


def test_noop_repro_and_param_change_reruns_only_dependents(tiny_repo):
    assert changed_stages(run(["dvc", "status"], tiny_repo).stdout) == set()
    params = yaml.safe_load((tiny_repo / "params.yaml").read_text())
    params["grade"]["folds"] = 4
    (tiny_repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    changed = changed_stages(run(["dvc", "status"], tiny_repo).stdout)
    assert "grade" in changed and "ingest" not in changed and "validate" not in changed
    run(["git", "checkout", "params.yaml"], tiny_repo)
    assert changed_stages(run(["dvc", "status"], tiny_repo).stdout) == set()


def test_every_stage_is_an_mlflow_run_of_one_execution(tiny_repo):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=repo_env(tiny_repo)["MLFLOW_TRACKING_URI"])
    experiments = [e.experiment_id for e in client.search_experiments()]
    tags = [r.data.tags for r in client.search_runs(experiments, max_results=1000) if "stage" in r.data.tags]
    stages = {t["stage"] for t in tags}
    assert {"ingest", "validate", "grade", "train@m1", "calibrate", "evaluate", "register"} <= stages, stages
    assert len({t["pipeline_execution"] for t in tags}) == 1
    assert all(len(t["git_commit"]) >= 40 for t in tags)


def test_push_and_pull_give_byte_identical_splits(tiny_repo, tmp_path):
    remote = tmp_path / "remote"
    run(["dvc", "remote", "add", "-f", "-d", "local", str(remote)], tiny_repo)
    run(["dvc", "push"], tiny_repo)
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(tiny_repo), str(clone)], tmp_path)
    run(["dvc", "remote", "add", "-f", "-d", "local", str(remote)], clone)
    run(["dvc", "pull", "data/graded", "data/prepared"], clone)
    for rel in ("data/graded/scores.csv", "data/graded/m1.txt", "data/prepared/train.npz"):
        assert (clone / rel).read_bytes() == (tiny_repo / rel).read_bytes(), rel
    shutil.rmtree(clone)


def test_failed_validation_stops_the_pipeline(tiny_repo, tmp_path):
    params = yaml.safe_load((tiny_repo / "params.yaml").read_text())
    params["validate"]["pixel_mean_min"] = 200.0  # no digit is that bright on average
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(params))
    out = tmp_path / "validation"
    result = run(["python", "-m", "stages.validate", "--params", str(bad), "--data", "data/prepared",
                  "--out", str(out)], tiny_repo, check=False)
    assert result.returncode == 5  # a failed check (pipeline.exit_codes)
    assert "expect_column_values_to_be_between(pixel_mean)" in result.stderr and "e.g. ids" in result.stderr


def test_a_failed_ingest_keeps_the_previous_data_and_metrics(tiny_repo, tmp_path):
    """DVC deletes a stage's outputs before running it unless they persist: ingest's do, and ingest
    writes them atomically, so a bad source leaves the last good data/prepared and metrics in place."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo, symlinks=True)
    kept = [repo / "metrics" / "ingest.json", *sorted((repo / "data" / "prepared").iterdir())]
    before = {p: p.read_bytes() for p in kept}
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["data"]["source"] = f"imagefolder:{tmp_path / 'no-such-folder'}"
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    result = run(["dvc", "repro", "ingest"], repo, check=False)
    assert result.returncode != 0 and "no-such-folder" in result.stdout + result.stderr
    assert {p: p.read_bytes() for p in kept if p.exists()} == before
