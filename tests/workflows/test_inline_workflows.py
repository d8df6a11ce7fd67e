"""The workflows of the stages that once held their work inline (pipeline.workflows.ingest, validate,
profile), on scikit-learn's bundled digits: no command line, no MLflow run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.io import save_split, write_json
from pipeline.models.config import ModelConfig
from pipeline.params.config import DataConfig, ProfileConfig, ValidateConfig, deep_merge, load_params
from pipeline.workflows.ingest import ingest_source
from pipeline.workflows.profile import cascade_for, module_lines, profile_model
from pipeline.workflows.validate import summary, validate_data

ROOT = Path(__file__).resolve().parents[2]
DATA = {"data": {"source": "digits", "image_size": 8, "channels": 1, "max_train": 300, "max_test": 100}}


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    params = deep_merge(load_params(ROOT / "params.yaml"), DATA)
    heard = []
    result = ingest_source(DataConfig.from_params(params), on_choice=heard.append)
    assert len(heard) == 1 and heard[0] is result.choice  # the choice is heard before the decoding
    out = tmp_path_factory.mktemp("prepared")
    for split in result.splits.values():
        save_split(out / f"{split.name}.npz", split)
    write_json(out / "meta.json", result.meta)
    return out, result


def test_ingest_splits_the_source_at_the_input_it_chose(ingested: tuple[Path, object]) -> None:
    _, result = ingested
    assert set(result.splits) == {"train", "route", "calib", "test"} and result.skipped is None
    counts = result.counts()
    assert 0 < counts["train_count"] <= 300 and counts["route_count"] > 0 and counts["calib_count"] > 0
    assert 0 < counts["test_count"] <= 100  # max_test caps the test split
    assert result.meta["image_shape"] == [1, 8, 8] and len(result.meta["classes"]) == 10


def test_validate_runs_every_suite_and_summarises_it(ingested: tuple[Path, object], tmp_path: Path) -> None:
    data, _ = ingested
    results = validate_data(data, ValidateConfig.from_params(load_params(ROOT / "params.yaml")), tmp_path / "docs")
    table = summary(results)
    assert set(table) == set(results) and all({"success", "rows", "failures"} <= set(row) for row in table.values())
    assert all(row["rows"] > 0 for row in table.values())


def test_profile_times_the_cascade_at_the_datas_input(ingested: tuple[Path, object]) -> None:
    data, _ = ingested
    params = load_params(ROOT / "params.yaml")
    spec, note = cascade_for(ModelConfig.from_params(params), data)
    assert spec.image_size == 8 and note is None  # 8 px: no stride-2 entry to announce
    cfg = ProfileConfig(repeats=1, batch_sizes=(1,), seed=0)
    lines = module_lines(profile_model(spec, cfg, device=torch.device("cpu")))
    assert len(lines) == len(spec.modules)
    metrics, line = lines[0]
    assert metrics["m1_min_macs"] <= metrics["m1_default_macs"] <= metrics["m1_max_macs"]
    assert line.startswith("profile m1:")
