"""The evaluate stage's whole comparison, as one call over already-loaded objects: the calibrated
cascade on the test split against its baselines (each exit alone, the cascade's own paths without
exits, its static twin, the fixed cascades, the plain CNNs, the oracle), every budget curve fitted on
calib and read on test, wall-clock timing, the routing tables and the target checks; plus the small
headline the DVC metrics file shows and the plots/CSVs of the curves (``stages/evaluate.py`` wires
them to files and MLflow)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from pipeline.evaluation.dominance import dominance
from pipeline.evaluation.figures import (
    candidate_exits,
    cascade_summary,
    exit_figures,
    fitted_curve,
    routing_candidates,
    routing_oracle,
    routing_table,
    target_checks,
    time_cascade,
    timing_noisy,
    to_numpy,
)
from pipeline.evaluation.records import ExitRecord, all_exits, cascade_output, record_models, scored_candidates
from pipeline.evaluation.routing_verdict import held_out_predictability, routing_verdicts, served_from
from pipeline.evaluation.two_cnn import baseline_arrays, baseline_figures
from pipeline.io import Split, atomic_path
from pipeline.models.modules import SupernetModule
from pipeline.models.profile import CostModel
from pipeline.report.plots import anytime_plot, budget_plot, confusion_plot
from pipeline.routing.engine import CascadeOutput, Stage
from pipeline.routing.package import LoadedCascade
from pipeline.train.baselines import Baselines

PLOT_LABELS = ("cascade (selected routing)", "static selection (claim 8)", "fixed cascade (default paths)",
               "two plain CNNs")
STATIC_ROWS = ("largest_candidate_static", "smallest_candidate_static", "space_largest_static",
               "space_smallest_static", "default_static")
Labelled = tuple[torch.Tensor, np.ndarray]  # preprocessed images on the cascade's device, labels


def static_stages(stages: list[Stage], costs: CostModel, which: str) -> list[Stage]:
    """Every module on one fixed path, no predictor, no early exit. ``largest_candidate`` /
    ``smallest_candidate``: the most / least expensive of the paths the cascade's stage runs (with
    no predictor: its one selected path, so both are the cascade without its early exits);
    ``space_largest``/``space_smallest``: the most / least expensive path in the whole search space;
    ``default``: every supernet on its spec's default path."""
    out = []
    for k, stage in enumerate(stages, start=1):
        if which == "default":
            arch = stage.module.default_arch()
        elif which.startswith("space_") and isinstance(stage.module, SupernetModule):
            table = costs.table["modules"][k - 1]["op_macs"]
            pick = max if which == "space_largest" else min
            arch = stage.module.space.make({label: pick(ops, key=ops.get) for label, ops in table.items()})
        else:
            pairs = list(zip(stage.candidate_macs, stage.candidates, strict=True))
            pick = max if "largest" in which else min  # largest_candidate, space_largest (fixed)
            arch = pick(pairs, key=lambda p: p[0])[1]
        out.append(Stage(stage.module, (arch,), (costs.macs(k, arch),), float("inf")))
    return out


def headline(results: dict) -> dict:
    """The handful of figures `dvc exp show` lists (short keys, narrow columns): the cascade's test
    accuracy and mean MACs (millions), against its own paths without early exits (the largest routing
    candidate per module: MACs share, accuracy gap in points, throughput speed-up at batch 256), its
    static twin's accuracy and the plain CNN baselines' accuracies."""
    cascade, vs, b = results["cascade"], results["vs_largest_candidate"], results["baselines"]
    return {"acc": round(cascade["accuracy"], 4), "mmacs": round(cascade["mean_macs"] / 1e6, 3),
            "macs_share": round(vs["macs_share"], 3), "gap_pts": round(vs["accuracy_gap_points"], 2),
            # a speed-up read on a machine too busy to time (repeats spread > 25%) is not reported
            "speedup": None if vs.get("timing_noisy") else round(vs["throughput_speedup_b256"], 2),
            "static_acc": round(results["static_selection"]["accuracy"], 4),
            "cnn_acc": round(b["plain_large"]["accuracy"], 4),
            "cnn2_acc": round(b["two_cnn_cascade"]["accuracy"], 4),
            **({"dominated": bool(results["shipped"]["dominated"])} if "shipped" in results else {})}


@dataclass(frozen=True)
class SuiteModels:
    """What evaluate compares: ``main`` the calibrated cascade, ``testset`` its static-selection twin,
    ``fixed`` / ``fixed_at_macs`` the fixed-path cascade calibrated on its own / at the cascade's calib
    MACs, ``plain`` the two plain CNNs."""

    main: LoadedCascade
    testset: LoadedCascade
    fixed: LoadedCascade
    fixed_at_macs: LoadedCascade
    plain: Baselines

    def cascades(self) -> dict[str, LoadedCascade]:
        return {"main": self.main, "testset": self.testset, "fixed": self.fixed, "fixed_at_macs": self.fixed_at_macs}


@dataclass(frozen=True)
class SuiteData:
    """``test`` / ``calib``: the raw splits (labels; uint8 images for the plain CNNs); ``x`` / ``xc``:
    their images preprocessed for the cascades (on their device); ``levels``: the test images' curriculum
    levels (None: not graded); ``predictability``: (`route`, `calib`) as (preprocessed images, labels),
    on which the routing verdict measures how predictable the right candidate is (None: not measured)."""

    test: Split
    calib: Split
    x: torch.Tensor
    xc: torch.Tensor
    levels: np.ndarray | None = None
    predictability: tuple[Labelled, Labelled] | None = None


@dataclass(frozen=True)
class SuiteSettings:
    """``models``: the trained modules (their recorded routing candidates); ``grid``: thresholds per exit
    of the budget curves; ``batch1_images``: images timed one by one; ``epoch_budget``: epochs as trained;
    ``shipped``: what calibrate shipped (the cascade, or the plain CNN it chose), whose dominance is read."""

    costs: CostModel
    models: Path
    grid: int
    batch1_images: int
    epoch_budget: dict[str, Any]
    shipped: str = "cascade"


def _cascade_row(record: ExitRecord, model: LoadedCascade, y: np.ndarray, levels: np.ndarray | None,
                 full: bool = True) -> tuple[dict[str, Any], CascadeOutput]:
    """A calibrated cascade's summary on test (its thresholds, its exit ensemble) and its outputs."""
    thresholds, decay = [s.threshold for s in model.stages[:-1]], model.meta.ensemble_decay
    out = cascade_output(record, model.meta.confidence_kind, thresholds, decay)
    row = cascade_summary(out, y, len(model.meta.classes), levels)
    if not full:
        return {"accuracy": row["accuracy"], "mean_macs": row["mean_macs"], "exit_share": row["exit_share"]}, out
    return {**row, "ensemble_decay": decay, "thresholds": thresholds}, out


def _static_rows(main: LoadedCascade, costs: CostModel, x: torch.Tensor,
                 y: np.ndarray) -> tuple[dict[str, dict], dict[str, list[Stage]]]:
    """The cascade's modules on fixed paths, no predictor, no early exit (``STATIC_ROWS``)."""
    stages = {name: static_stages(main.stages, costs, name.removesuffix("_static")) for name in STATIC_ROWS}
    records = record_models(stages, x)
    rows = {}
    for name, path in stages.items():
        out = cascade_output(records[name], main.meta.confidence_kind, [s.threshold for s in path[:-1]])
        rows[name] = {"accuracy": float((to_numpy(out.pred) == y).mean()), "mean_macs": float(out.macs.float().mean()),
                      "paths": [s.candidates[0].key() for s in path]}
    return rows, stages


def _curves(models: SuiteModels, data: SuiteData, test: dict[str, dict], grid: int) -> dict[str, list[dict]]:
    """The budget curves: thresholds fitted on calib at each budget, read on test (``fitted_curve``)."""
    calib = record_models({name: models.cascades()[name].stages for name in ("main", "testset", "fixed")}, data.xc)
    keys = ("_conf", "_correct", "_cum")
    out = {}
    for name, label in (("main", "cascade"), ("testset", "static_selection"), ("fixed", "fixed_cascade")):
        m = models.cascades()[name]
        outs = all_exits(calib[name], m.meta.confidence_kind, m.meta.ensemble_decay)
        on_calib = exit_figures(outs, data.calib.labels)
        out[label] = fitted_curve(tuple(on_calib[k] for k in keys), tuple(test[name][k] for k in keys), grid=grid)
    return out


def _baselines(models: SuiteModels, data: SuiteData, records: dict[str, ExitRecord],
               fixed_exits: list[dict]) -> tuple[dict[str, Any], tuple[np.ndarray, ...]]:
    """The plain CNNs (one pass each over test), the fixed cascade at its own point and at the cascade's
    calib MACs; and the plain CNNs' test arrays (the two-CNN budget curve reads them)."""
    y = data.test.labels
    arrays = baseline_arrays(models.plain, data.test.images, y)
    fixed, _ = _cascade_row(records["fixed"], models.fixed, y, None, full=False)
    at, _ = _cascade_row(records["fixed_at_macs"], models.fixed_at_macs, y, None, full=False)
    return {**baseline_figures(models.plain, arrays),
            "fixed_cascade": {**fixed, "thresholds": [s.threshold for s in models.fixed.stages[:-1]],
                              "ensemble_decay": models.fixed.meta.ensemble_decay, "each_exit": fixed_exits},
            "fixed_cascade_at_cascade_macs": {
                **at, "thresholds": [s.threshold for s in models.fixed_at_macs.stages[:-1]],
                "ensemble_decay": models.fixed_at_macs.meta.ensemble_decay}}, arrays


def _routing(models: SuiteModels, data: SuiteData, settings: SuiteSettings, record: ExitRecord,
             routed: CascadeOutput, results: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """Each routing candidate as an exit, and the routing table with its verdicts (``routing_verdict``)."""
    main, twin, kind = models.main, models.testset, models.main.meta.confidence_kind
    recorded = routing_candidates(settings.models, settings.costs, main.stages)
    scored = scored_candidates(record, data.test.labels, main.meta.ensemble_decay)
    rows = candidate_exits(scored)
    table = routing_table(main.stages, to_numpy(routed.choices), recorded, rows, routing_oracle(scored))
    pred = ({} if data.predictability is None else  # fitted on route, read on calib: never on test
            held_out_predictability(twin.stages, recorded, *data.predictability, kind, twin.meta.ensemble_decay))
    verdicts = routing_verdicts(table, settings.models, scored, served_from(main.stages, recorded,
                                                                            to_numpy(record.choices)),
                                to_numpy(routed.choices) >= 0, [s.predictor_macs for s in main.stages], pred,
                                results["cascade"], results["static_selection"])
    return rows, verdicts


def _timing(main: LoadedCascade, static: list[Stage], x: torch.Tensor, batch1_images: int,
            results: dict[str, Any]) -> tuple[dict, dict]:
    """Wall clock of the real engine: the cascade against its paths without exits."""
    kind = main.meta.confidence_kind
    timing = {"cascade": time_cascade(main.stages, x, kind, batch1_images=batch1_images, big_batch=256,
                                      decay=main.meta.ensemble_decay),
              "largest_candidate_static": time_cascade(static, x, kind, batch1_images=batch1_images, big_batch=256)}
    big, cascade = results["largest_candidate_static"], results["cascade"]
    macs_ratio = big["mean_macs"] / cascade["mean_macs"]
    speedup = timing["cascade"]["throughput_b256"] / timing["largest_candidate_static"]["throughput_b256"]
    return timing, {
        "accuracy_gap_points": 100 * (big["accuracy"] - cascade["accuracy"]),
        "macs_share": cascade["mean_macs"] / big["mean_macs"], "macs_ratio": macs_ratio,
        "throughput_speedup_b256": speedup, "speedup_over_macs_ratio": speedup / macs_ratio,
        "timing_noisy": timing_noisy(timing["cascade"], timing["largest_candidate_static"]),
        "latency_speedup_b1": timing["largest_candidate_static"]["latency_ms_b1_median"]
        / timing["cascade"]["latency_ms_b1_median"]}


def record_test(models: SuiteModels, data: SuiteData, settings: SuiteSettings) -> dict[str, ExitRecord]:
    """The four cascades' one pass each over test (a network two of them share runs once); the
    shipped cascade's also runs each recorded routing candidate as its module's exit."""
    recorded = {"main": routing_candidates(settings.models, settings.costs, models.main.stages)}
    return record_models({name: m.stages for name, m in models.cascades().items()}, data.x, recorded)


def evaluation_suite(models: SuiteModels, data: SuiteData,
                     settings: SuiteSettings) -> tuple[dict[str, Any], dict[str, list[dict]]]:
    """Every figure of ``metrics/evaluate.json`` (in its order) and the four budget curves by plot label,
    each read off one engine pass per model over test (``records``), then timed. Run it with grad
    disabled."""
    main, y, kind = models.main, data.test.labels, models.main.meta.confidence_kind
    records = record_test(models, data, settings)
    results: dict[str, Any] = {}
    results["cascade"], routed = _cascade_row(records["main"], main, y, data.levels)
    results["static_selection"], _ = _cascade_row(records["testset"], models.testset, y, data.levels)
    test = {name: exit_figures(all_exits(records[name], kind, models.cascades()[name].meta.ensemble_decay), y)
            for name in ("main", "testset", "fixed")}
    results["each_exit"], results["oracle"] = test["main"]["exits"], test["main"]["oracle"]
    results["each_exit_alone"] = exit_figures(all_exits(records["main"], kind), y)["exits"]  # no ensemble
    results["baselines"], plain_test = _baselines(models, data, records, test["fixed"]["exits"])
    results["candidate_exits"], results["routing"] = _routing(models, data, settings, records["main"], routed,
                                                              results)
    statics, static_paths = _static_rows(main, settings.costs, data.x, y)
    results.update(statics)
    results["timing"], results["vs_largest_candidate"] = _timing(
        main, static_paths["largest_candidate_static"], data.x, settings.batch1_images, results)
    curves = _curves(models, data, test, settings.grid)
    curves["two_cnn_cascade"] = fitted_curve(baseline_arrays(models.plain, data.calib.images, data.calib.labels),
                                             plain_test, grid=settings.grid)
    results["budget_curves"] = curves
    results["epoch_budget"] = settings.epoch_budget
    results["shipped"] = dominance(results, len(y), settings.shipped)  # dominated by another model of the run?
    results["targets"] = target_checks(results)
    return results, dict(zip(PLOT_LABELS, curves.values(), strict=True))


def write_evaluation_plots(directory: str | os.PathLike[str], results: dict[str, Any],
                           curves: dict[str, list[dict]], classes: Sequence[str]) -> None:
    """``directory`` (written whole or not at all): the budget curves (CSV and plot, with the cascade,
    its baselines and the oracle as points), the anytime curve of the exits and the cascade's confusion
    matrix."""
    with atomic_path(directory, is_dir=True) as tmp:
        pd.concat([pd.DataFrame([{**r, "thresholds": " ".join(f"{t:.4f}" for t in r["thresholds"])}
                                 for r in rows]).assign(model=name) for name, rows in curves.items()]).to_csv(
            tmp / "budget_curve.csv", index=False)
        pd.DataFrame(results["each_exit"]).to_csv(tmp / "anytime.csv", index=False)
        b, cascade = results["baselines"], results["cascade"]
        points = {"cascade (calibrated)": cascade, "fixed cascade (calibrated)": b["fixed_cascade"],
                  "fixed cascade at the cascade's MACs": b["fixed_cascade_at_cascade_macs"],
                  "two plain CNNs (calibrated)": b["two_cnn_cascade"], "plain small CNN": b["plain_small"],
                  "plain large CNN": b["plain_large"],
                  "cascade's paths, no exits": results["largest_candidate_static"],
                  "oracle": results["oracle"]}
        budget_plot(tmp / "budget_curve.png", curves, points)
        anytime_plot(tmp / "anytime.png", results["each_exit"])
        confusion_plot(tmp / "confusion.png", np.array(cascade["confusion"]), classes)


def summary_line(results: dict[str, Any]) -> str:
    """The stage's one closing line: the cascade against its paths without exits, its static twin and
    the oracle, and the speed-up against the MACs ratio (noted when the timing was too noisy to read)."""
    cascade, big, v = results["cascade"], results["largest_candidate_static"], results["vs_largest_candidate"]
    static, oracle = results["static_selection"], results["oracle"]
    return (f"evaluate: cascade {cascade['accuracy']:.4f} at {cascade['mean_macs']:,.0f} MACs (exits "
            f"{cascade['exit_share']}); its paths without exits {big['accuracy']:.4f} at "
            f"{big['mean_macs']:,.0f}; static selection {static['accuracy']:.4f} at "
            f"{static['mean_macs']:,.0f}; oracle {oracle['mean_macs']:,.0f} MACs; "
            f"MACs share {v['macs_share']:.3f}, speed-up {v['throughput_speedup_b256']:.2f}x vs MACs ratio "
            f"{v['macs_ratio']:.2f}x" + (" (timing too noisy to read: the machine was busy; headline speedup "
                                         "left out)" if v["timing_noisy"] else ""))
