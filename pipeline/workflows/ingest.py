"""Ingest's workflow (``stages.ingest`` parses, calls :func:`ingest_source`, writes and logs): the input
size chosen from the data, the source decoded at it, and the stratified splits checked to hold every
class (docs/DESIGN.md "Stages and workflows")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.data.input_shape import InputChoice, resolve_input
from pipeline.data.sources import DataError, load_source
from pipeline.data.splits import SplitPlan, check_class_coverage, make_splits, split_meta
from pipeline.io import Split
from pipeline.params.config import DataConfig


@dataclass(frozen=True)
class IngestResult:
    source: str
    choice: InputChoice  # the input size and channels, and why
    splits: dict[str, Split]
    meta: dict[str, Any]  # meta.json: classes, image shape, split sizes
    skipped: tuple[str, ...] | None  # files of an image folder that are not images, named

    def counts(self) -> dict[str, int]:
        return {f"{name}_count": len(s) for name, s in self.splits.items()}


def ingest_source(cfg: DataConfig, on_choice: Any = None) -> IngestResult:
    """The source of ``cfg`` decoded at the input size the data asks for (``on_choice`` hears the choice
    before the decoding starts) and split by ``cfg``'s plan; a DataError naming a class too small for
    every split, or caps that leave too few images to split."""
    choice = resolve_input(cfg.source, cfg.image_size, cfg.channels, cfg.max_pixels)
    if on_choice is not None:
        on_choice(choice)
    data = load_source(cfg.source, channels=choice.channels, image_size=choice.image_size,
                       max_pixels=cfg.max_pixels)
    plan = SplitPlan(cfg.val_fraction, cfg.route_fraction, cfg.test_fraction, cfg.max_train, cfg.max_test, cfg.seed)
    check_class_coverage(data, plan)  # before splitting: the fractions alone leave a class out
    try:
        splits = make_splits(data, plan)
    except ValueError as exc:  # only caps small enough to empty a whole carve get here
        raise DataError(f"data.max_train {plan.max_train} / data.max_test {plan.max_test} leave too few "
                        f"images of {data.source} to split: {exc}") from None
    check_class_coverage(data, plan, splits)  # after: the caps can thin a class out of a split
    skipped = None if data.skipped is None else tuple(data.skipped)
    return IngestResult(data.source, choice, splits, split_meta(splits, data.classes, data.source), skipped)
