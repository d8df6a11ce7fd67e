"""bench/stage_overhead.py: the split of a run's span into the stages' work and the time between them,
read from a real MLflow store."""

from __future__ import annotations

import json

import pytest

from bench.stage_overhead import EXECUTION_TAG, main, split, stage_runs


def test_split_puts_the_gaps_between_runs_outside_the_stages():
    runs = [{"stage": "a", "start": 100.0, "end": 101.0}, {"stage": "b", "start": 107.0, "end": 117.0},
            {"stage": "c", "start": 121.0, "end": 122.0}]
    row = split(runs)
    assert row["span_s"] == 22.0 and row["inside_stages_s"] == 12.0 and row["between_stages_s"] == 10.0
    assert row["gap_median_s"] == 5.0 and row["per_stage_s"] == {"a": 1.0, "b": 10.0, "c": 1.0}


def _store_with_two_executions(repo):
    import mlflow

    uri = f"sqlite:///{repo / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("pipeline")
    for execution, names in (("old", ["ingest"]), ("new", ["ingest", "train@m1"])):
        for name in names:
            run = client.create_run(exp, run_name=name, tags={EXECUTION_TAG: execution})
            client.set_terminated(run.info.run_id)
    client.create_run(exp, run_name="still-running", tags={EXECUTION_TAG: "new"})  # no end time: left out


def test_only_the_latest_execution_is_read_and_the_record_is_written(tmp_path):
    _store_with_two_executions(tmp_path)
    runs = stage_runs(tmp_path)
    assert [r["stage"] for r in runs] == ["ingest", "train@m1"]
    assert all(r["end"] >= r["start"] for r in runs)
    out = tmp_path / "overhead.json"
    assert main(["--runs", str(tmp_path), "--repeats", "0", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["runs"][0]["stages"] == 2 and record["process_seconds"] == {}


def test_a_folder_without_a_store_is_named_in_the_error(tmp_path):
    with pytest.raises(SystemExit, match=str(tmp_path)):
        stage_runs(tmp_path)
