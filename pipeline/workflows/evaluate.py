"""Evaluate's workflow (``stages.evaluate`` parses, calls :func:`evaluate_models`, writes and prints): load
the shipped model and its baselines, the test split (read here only) and the held-out images the curves
are fitted on as calibrate fits, and run :func:`pipeline.evaluation.suite.evaluation_suite`
(docs/DESIGN.md "Stages and workflows")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.data.difficulty import hard_setting_applies
from pipeline.data.grader_store import GRADER_FILE, levels_of, load_grader
from pipeline.device import ComputeConfig, autocast, to_device
from pipeline.evaluation.figures import comparison_table
from pipeline.evaluation.routing_verdict import verdict_lines
from pipeline.evaluation.suite import SuiteData, SuiteModels, SuiteSettings, evaluation_suite, summary_line
from pipeline.io import load_held_out, load_split, read_json
from pipeline.models.profile import CostModel
from pipeline.params.config import CalibrateConfig
from pipeline.routing.assemble import calibrated_cascade
from pipeline.routing.package import LoadedCascade, load_cascade
from pipeline.routing.recognize import preprocess
from pipeline.train.baselines import BaselineConfig, load_baselines
from pipeline.train.outputs import epochs_trained


@dataclass(frozen=True)
class EvaluateInputs:
    data: Path  # written by ingest
    graded: Path  # written by grade: the grading model, the difficulty scores
    profile: Path  # the cost model
    model: Path  # the shipped model: the calibrated cascade or the plain CNN calibrate chose
    calibration: Path  # calibrate's metrics: what shipped and the cascade's fit
    model_testset: Path  # every supernet on its static choice
    model_fixed: Path  # every supernet on its default path
    model_fixed_at_macs: Path  # the fixed cascade calibrated at the selected cascade's MACs
    models: Path  # the trained modules (models/modules)
    baselines: Path  # the plain CNNs


@dataclass(frozen=True)
class EvaluationResult:
    results: dict[str, Any]  # every figure of metrics/evaluate.json, in its order
    curves: dict[str, list[dict]]  # the budget curves by plot label
    classes: tuple[str, ...]
    shipped: str  # "cascade" or the plain CNN calibrate shipped instead

    def run_metrics(self) -> dict[str, float]:
        r = self.results
        return {"test_accuracy": r["cascade"]["accuracy"], "test_mean_macs": r["cascade"]["mean_macs"],
                "static_selection_accuracy": r["static_selection"]["accuracy"],
                "largest_candidate_accuracy": r["largest_candidate_static"]["accuracy"],
                "oracle_mean_macs": r["oracle"]["mean_macs"],
                **{f"vs_largest_candidate_{k}": v for k, v in r["vs_largest_candidate"].items()}}

    def lines(self) -> list[str]:
        what = ("cascade" if self.shipped == "cascade"
                else f"model ({self.shipped}, chosen over the cascade on held-out images)")
        return [comparison_table(self.results), summary_line(self.results),
                f"evaluate: the shipped {what} is {self.results['shipped']['verdict']}", *verdict_lines(self.results)]


def _shipped_cascade(inputs: EvaluateInputs, costs: CostModel, device: torch.device) -> tuple[LoadedCascade, str]:
    """The calibrated cascade, rebuilt from the modules and calibrate's fit where a plain CNN shipped."""
    main = load_cascade(inputs.model, device)
    calibration = read_json(inputs.calibration)
    shipped = (calibration.get("shipped") or {}).get("model", "cascade")  # no record: written before it shipped plain
    if shipped != "cascade":
        main = calibrated_cascade(inputs.models, costs, calibration["selected"], main, device)
    return main, shipped


def _epoch_budget(inputs: EvaluateInputs, base: BaselineConfig, modules: tuple[str, ...]) -> dict[str, Any]:
    """Epochs as trained: the step floor may have raised the configured epochs on small data."""
    meta = read_json(inputs.data / "meta.json")
    hard = hard_setting_applies(base.min_steps_hard, inputs.graded, len(meta["classes"]))
    return {"baselines": base.sized_to(meta["splits"]["train"]["count"], hard).epochs,
            "modules": [epochs_trained(inputs.models / key / "train") for key in modules]}


def evaluate_models(inputs: EvaluateInputs, cal: CalibrateConfig, base: BaselineConfig, compute: ComputeConfig,
                    modules: tuple[str, ...], batch1_images: int) -> EvaluationResult:
    """Every figure of the shipped model and its baselines on test; curves fitted on ``cal.held_out``
    with ``cal.grid`` thresholds per exit. ``modules``: the cascade's module keys (m1..mK)."""
    device = compute.resolve()
    costs = CostModel(read_json(inputs.profile))
    test, calib = load_split(inputs.data, "test"), load_held_out(inputs.data, cal.held_out)
    main, shipped = _shipped_cascade(inputs, costs, device)
    testset, fixed, fixed_at_macs = (load_cascade(path, device) for path in
                                     (inputs.model_testset, inputs.model_fixed, inputs.model_fixed_at_macs))
    plain = load_baselines(inputs.baselines)
    to_device((plain.small, plain.large), device)
    meta = main.meta
    x, xc = preprocess(test.images, meta).to(device), preprocess(calib.images, meta).to(device)
    route_calib = tuple((preprocess(s.images, meta).to(device), s.labels)  # the routing verdict's AUC
                        for s in (load_split(inputs.data, "route"), load_split(inputs.data, "calib")))
    levels = levels_of(load_grader(inputs.graded / GRADER_FILE), test.images, test.labels,
                       inputs.graded / "scores.csv")
    with torch.no_grad(), autocast(device, compute.precision):
        results, curves = evaluation_suite(
            SuiteModels(main, testset, fixed, fixed_at_macs, plain),
            SuiteData(test, calib, x, xc, levels, route_calib),
            SuiteSettings(costs, inputs.models, cal.grid, batch1_images, _epoch_budget(inputs, base, modules), shipped))
    return EvaluationResult(results, curves, tuple(meta.classes), shipped)
