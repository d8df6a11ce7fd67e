"""The baselines and calibrate workflows called directly on tiny data (no argparse, no files but their
inputs): what they return, the rules they follow, and that neither reads the test split."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.device import ComputeConfig
from pipeline.params.config import CalibrateConfig, ParamsRecord
from pipeline.train.baselines import LARGE, SMALL, TWO_CNN, BaselineConfig, load_baselines, save_baselines
from pipeline.workflows.baselines import BaselinesResult, train_baselines
from pipeline.workflows.calibrate import BUDGET_TWIN, ROUTINGS, CalibrateInputs, calibrate_cascades
from tests.workflows.workflow_data import write_data, write_modules

CPU = ComputeConfig.from_params({"compute": {"device": "cpu"}})
BASE = BaselineConfig(small_width=2, large_width=2, epochs=1, batch_size=16, warmup_epochs=0.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BaselinesResult]:
    root = tmp_path_factory.mktemp("workflows")
    data = write_data(root / "data")  # no test.npz: reading it would fail
    return data, train_baselines(data, root / "graded", BASE, CalibrateConfig.from_params({}), "maxprob", 3, CPU)


def test_baselines_train_both_nets_and_record_no_timings(run: tuple[Path, BaselinesResult]) -> None:
    _, result = run
    assert set(result.nets) == {SMALL, LARGE}
    assert all(p.device.type == "cpu" for net in result.nets.values() for p in net.parameters())
    assert result.metrics["calib_images"] == 48  # pooled by default: route (24) + calib (24)
    assert result.metrics["train_images"] == 48 and result.note is None
    assert all("train_seconds" in result.metrics[name] for name in (SMALL, LARGE))
    assert "train_seconds" not in str(result.record.calib)  # identical runs, identical model bytes
    assert result.record.threshold == result.metrics[TWO_CNN]["threshold"]
    assert set(result.run_metrics()) >= {f"{SMALL}_calib_accuracy", f"{TWO_CNN}_calib_mean_macs"}
    assert len(result.lines()) == 3


def test_baselines_raise_the_epochs_to_the_step_floor_and_say_so(tmp_path: Path) -> None:
    data = write_data(tmp_path / "data")
    floored = BaselineConfig(small_width=2, large_width=2, epochs=1, batch_size=16, warmup_epochs=0.0, min_steps=6)
    result = train_baselines(data, tmp_path / "graded", floored, CalibrateConfig.from_params(
        {"calibrate": {"held_out": "calib"}}), "maxprob", 0, CPU)
    assert result.metrics["epochs"] == 2 and "2" in (result.note or "")  # 48 images / 16 = 3 steps an epoch
    assert result.metrics["calib_images"] == 24  # calib alone


def test_calibrate_fits_every_routing_and_the_budget_twin(run: tuple[Path, BaselinesResult],
                                                          tmp_path: Path) -> None:
    data, baselines = run
    save_baselines(tmp_path / "baselines", baselines.nets[SMALL], baselines.nets[LARGE], baselines.record)
    models, profile = write_modules(tmp_path)
    cfg = CalibrateConfig.from_params({"calibrate": {"grid": 5, "ensemble_decays": [0.0, 1.0]}})
    lineage = ParamsRecord.from_params({"modules": {"m1": {}}, "train": {"epochs": 1}})
    with torch.no_grad():
        result = calibrate_cascades(CalibrateInputs(data, profile, models, tmp_path / "baselines"), cfg,
                                    "maxprob", CPU, lineage)
    assert tuple(result.fits) == (*ROUTINGS, BUDGET_TWIN) and set(result.packages) == set(result.fits)
    twin = result.fits[BUDGET_TWIN]
    assert twin["budget_macs"] == result.fits["selected"]["mean_macs"]  # the fixed cascade at equal cost
    assert twin["budget_met"] == (twin["mean_macs"] <= twin["budget_macs"])
    for routing in ROUTINGS:
        stages, meta = result.packages[routing]
        if routing == "selected" and result.shipped["model"] != "cascade":
            assert meta.info["routing"] == result.shipped["model"] and len(stages) == 1
            continue
        assert meta.info["params"] == {"calibrate": cfg.section(), "modules": {"m1": {}}, "train": {"epochs": 1}}
        assert [s.threshold for s in stages[:-1]] == result.fits[routing]["thresholds"]
        assert result.fits[routing]["ensemble_decay"] in cfg.ensemble_decays
    metrics = result.metrics()
    assert metrics["shipped"] == result.shipped and all("sweep" not in m for m in metrics.values())
    assert {row["routing"] for row in result.sweep_rows()} <= set(result.fits)
    assert result.lines()[-1] == f"calibrate: {result.shipped['reason']}"
    assert load_baselines(tmp_path / "baselines").meta.threshold == baselines.record.threshold
