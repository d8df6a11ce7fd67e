"""Validate's workflow (``stages.validate`` parses, calls :func:`validate_data`, writes, logs and fails
on a failed suite): every split checked by its Great Expectations suite, with a summary per suite
(docs/DESIGN.md "Stages and workflows")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.data.splits import SPLITS
from pipeline.data.validation import CheckResult, validate_splits
from pipeline.io import load_split, read_json
from pipeline.params.config import ValidateConfig


def validate_data(data: Path, cfg: ValidateConfig, docs_dir: Path) -> dict[str, CheckResult]:
    """The suites' results on ingest's splits in ``data`` (the GX data docs written to ``docs_dir``)."""
    splits = {name: load_split(data, name) for name in SPLITS}
    return validate_splits(splits, read_json(data / "meta.json"), cfg, docs_dir=docs_dir)


def summary(results: dict[str, CheckResult]) -> dict[str, Any]:
    """summary.json: per suite, whether it passed, the rows it read and its failures."""
    return {name: {"success": r.success, "rows": r.evaluated, "failures": list(r.failures)}
            for name, r in results.items()}
