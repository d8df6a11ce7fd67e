"""Data validation with Great Expectations 1.x over a per-sample table.

The table has one row per image (id, split, label, pixel mean/std/min/max, content hash, whether the
same content appears in another split). Each split gets its own suite run and JSON result; a
cross-split suite checks id uniqueness and leakage. The grading checks live here too.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.io import Split
from pipeline.params.config import ValidateConfig


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one suite on one table: failures name the expectation, count and example ids."""

    name: str
    success: bool
    evaluated: int
    failures: tuple[str, ...]
    raw: dict = field(repr=False, compare=False)


def sample_table(splits: Mapping[str, Split]) -> pd.DataFrame:
    """One row per image with the statistics the expectations read."""
    frames = []
    for name, split in splits.items():
        flat = split.images.reshape(len(split), -1)
        frames.append(pd.DataFrame({
            "id": split.ids.astype(str),
            "split": name,
            "label": split.labels.astype(np.int64),
            "pixel_mean": flat.mean(axis=1),
            "pixel_std": flat.std(axis=1),
            "pixel_min": flat.min(axis=1).astype(np.int64),
            "pixel_max": flat.max(axis=1).astype(np.int64),
            "hash": [hashlib.blake2b(row.tobytes(), digest_size=12).hexdigest() for row in flat],
        }))
    table = pd.concat(frames, ignore_index=True)
    splits_per_hash = table.groupby("hash")["split"].nunique()
    table["in_other_split"] = table["hash"].map(splits_per_hash).gt(1)
    return table


def class_share_table(table: pd.DataFrame, n_classes: int) -> pd.DataFrame:
    """Per split and class: its share, the share over all splits together, and the deviation."""
    overall = np.bincount(table["label"], minlength=n_classes) / len(table)
    rows = []
    for name, part in table.groupby("split", sort=False):
        shares = np.bincount(part["label"], minlength=n_classes) / len(part)
        for cls in range(n_classes):
            rows.append({"split": name, "label": cls, "share": shares[cls], "reference": overall[cls],
                         "deviation": abs(shares[cls] - overall[cls])})
    return pd.DataFrame(rows)


@contextlib.contextmanager
def gx_context(docs_dir: Path | None) -> Iterator[Any]:
    """A throw-away file-backed GX context (so data docs can be built), removed afterwards."""
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx

    root = Path(tempfile.mkdtemp(prefix="gx-"))
    try:
        context = gx.get_context(mode="file", project_root_dir=str(root))
        from great_expectations.data_context.types.base import ProgressBarsConfig

        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        yield context
        if docs_dir is not None:
            context.build_data_docs()
            site = root / "gx" / "uncommitted" / "data_docs" / "local_site"
            shutil.copytree(site, docs_dir, dirs_exist_ok=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_suite(context: Any, name: str, frame: pd.DataFrame, expectations: list[Any],
              id_column: str | None = "id") -> CheckResult:
    """Run ``expectations`` on ``frame`` as a named suite and summarise failures with example ids."""
    import great_expectations as gx

    source = context.data_sources.add_pandas(f"src_{name}")
    batch = source.add_dataframe_asset(f"asset_{name}").add_batch_definition_whole_dataframe(f"batch_{name}")
    suite = context.suites.add(gx.ExpectationSuite(name=name))
    for expectation in expectations:
        suite.add_expectation(expectation)
    definition = context.validation_definitions.add(gx.ValidationDefinition(data=batch, suite=suite, name=name))
    result_format = {"result_format": "COMPLETE", "unexpected_index_column_names": [id_column]} if id_column \
        else {"result_format": "SUMMARY"}
    result = definition.run(batch_parameters={"dataframe": frame}, result_format=result_format)
    failures = []
    for res in result.results:
        if res.success:
            continue
        config = res.expectation_config
        info = res.result or {}
        column = config.kwargs.get("column") or ",".join(
            str(config.kwargs[k]) for k in ("column_A", "column_B") if k in config.kwargs)
        detail = f"{config.type}({column})" if column else config.type
        count = info.get("unexpected_count")
        examples = [row.get(id_column) for row in (info.get("unexpected_index_list") or [])[:5]
                    if isinstance(row, dict)] if id_column else []
        observed = info.get("observed_value")
        message = f"{name}: expectation {detail} failed"
        if count is not None:
            message += f" for {count} of {info.get('element_count', len(frame))} rows"
        if examples:
            message += f", e.g. ids {examples}"
        if observed is not None:
            message += f" (observed {observed!r})"
        failures.append(message)
    raw = result.describe_dict() if hasattr(result, "describe_dict") else result.to_json_dict()
    return CheckResult(name, bool(result.success), len(frame), tuple(failures), raw)


def split_expectations(meta_split: Mapping[str, Any], n_classes: int, cfg: ValidateConfig) -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectTableRowCountToEqual(value=int(meta_split["count"])),
        gxe.ExpectColumnValuesToBeInSet(column="label", value_set=list(range(n_classes))),
        gxe.ExpectColumnValuesToNotBeNull(column="id"),
        gxe.ExpectColumnValuesToBeUnique(column="id"),
        gxe.ExpectColumnValuesToBeBetween(column="pixel_min", min_value=0, max_value=255),
        gxe.ExpectColumnValuesToBeBetween(column="pixel_max", min_value=0, max_value=255),
        gxe.ExpectColumnValuesToBeBetween(column="pixel_mean", min_value=cfg.pixel_mean_min,
                                          max_value=cfg.pixel_mean_max),
        gxe.ExpectColumnValuesToBeBetween(column="pixel_std", min_value=cfg.min_pixel_std),
        gxe.ExpectColumnValuesToBeInSet(column="in_other_split", value_set=[False],
                                        mostly=1.0 - cfg.max_duplicate_share),
    ]


def validate_splits(splits: Mapping[str, Split], meta: Mapping[str, Any], cfg: ValidateConfig,
                    docs_dir: Path | None = None) -> dict[str, CheckResult]:
    """Every suite: one per split, one across splits (ids), one on class shares."""
    n_classes = len(meta["classes"])
    table = sample_table(splits)
    shares = class_share_table(table, n_classes)
    import great_expectations.expectations as gxe

    results: dict[str, CheckResult] = {}
    with gx_context(docs_dir) as context:
        for name, part in table.groupby("split", sort=False):
            expectations = split_expectations(meta["splits"][name], n_classes, cfg)
            results[name] = run_suite(context, name, part.reset_index(drop=True), expectations)
        results["cross_split"] = run_suite(context, "cross_split", table, [
            gxe.ExpectColumnValuesToBeUnique(column="id"),
            gxe.ExpectTableRowCountToEqual(value=sum(int(s["count"]) for s in meta["splits"].values())),
        ])
        shares["key"] = shares["split"] + "/" + shares["label"].astype(str)
        results["class_shares"] = run_suite(context, "class_shares", shares, [
            gxe.ExpectColumnValuesToBeBetween(column="deviation", max_value=cfg.class_share_tolerance),
        ], id_column="key")
    return results


def validate_grading(scores: pd.DataFrame, train_ids: np.ndarray, levels: int,
                     size_tolerance: float = 0.01) -> CheckResult:
    """Grading checks: every training id graded once, level sizes on target, difficulty increasing."""
    import great_expectations.expectations as gxe

    target = len(train_ids) / levels
    per_level = scores.groupby("level").agg(count=("score", "size"), mean_score=("score", "mean")).reset_index()
    per_level = per_level.sort_values("level").reset_index(drop=True)
    per_level["size_deviation"] = (per_level["count"] - target).abs() / target
    per_level["prev_mean"] = per_level["mean_score"].shift(1).fillna(-np.inf)
    scores = scores.assign(is_training_id=scores["id"].isin(set(map(str, train_ids))))
    with gx_context(None) as context:
        main = run_suite(context, "grading", scores, [
            gxe.ExpectColumnValuesToBeUnique(column="id"),
            gxe.ExpectTableRowCountToEqual(value=len(train_ids)),
            gxe.ExpectColumnValuesToBeInSet(column="is_training_id", value_set=[True]),
            gxe.ExpectColumnValuesToBeInSet(column="level", value_set=list(range(1, levels + 1))),
            gxe.ExpectColumnValuesToBeBetween(column="score", min_value=0.0, max_value=1.0),
        ])
        per_level["level_name"] = "level-" + per_level["level"].astype(str)
        lv = run_suite(context, "grading_levels", per_level, [
            gxe.ExpectTableRowCountToEqual(value=levels),
            gxe.ExpectColumnValuesToBeBetween(column="size_deviation", max_value=size_tolerance),
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="mean_score", column_B="prev_mean"),
        ], id_column="level_name")
    missing = sorted(set(map(str, train_ids)) - set(scores["id"]))[:5]
    failures = main.failures + lv.failures
    if missing:
        failures += (f"grading: training ids never graded, e.g. {missing}",)
    return CheckResult("grading", main.success and lv.success and not missing, len(scores), failures,
                       {"samples": main.raw, "levels": lv.raw})
