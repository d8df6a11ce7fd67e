"""The grade stage's workflow (``stages.grade`` parses, calls :func:`grade_training_set`, writes and
plots): every training image's difficulty, its level, one training id list per module by the curriculum,
and the grading checked (docs/DESIGN.md "Stages and workflows")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sklearn.pipeline import Pipeline
from tqdm import tqdm

from pipeline.data.grading import Grading, grade
from pipeline.data.validation import validate_grading
from pipeline.io import Split
from pipeline.params.config import GradeConfig


class GradingFailed(ValueError):
    """The grading's own checks failed; the message lists them."""


@dataclass(frozen=True)
class GradeOutcome:
    grading: Grading
    model: Pipeline  # the grading model, fitted on every training image
    scores: pd.DataFrame  # id, label, score, level per training image (scores.csv)
    module_ids: dict[int, np.ndarray]  # module -> its training ids by the curriculum (repeats kept)
    metrics: dict[str, Any]  # the metrics file

    def score_histogram_rows(self) -> list[dict[str, Any]]:
        """The per-level score histogram (40 bins over [0, 1]) as CSV rows."""
        edges, g = np.linspace(0, 1, 41), self.grading
        return [{"score": round(float((edges[i] + edges[i + 1]) / 2), 4), "level": f"level {lv}", "count": int(n)}
                for lv in sorted(self.module_ids)
                for i, n in enumerate(np.histogram(g.scores[g.levels == lv], edges)[0])]

    def run_metrics(self) -> dict[str, float]:
        out = {}
        for level in self.metrics["levels"]:
            out.update({f"level{level['level']}_count": level["count"],
                        f"level{level['level']}_mean_score": level["mean_score"]})
        return {**out, **{f"module{m['module']}_train_count": m["count"] for m in self.metrics["modules"]}}

    def line(self) -> str:
        return "grade: " + ", ".join(f"L{s['level']}: n={s['count']} mean={s['mean_score']:.3f}"
                                     for s in self.metrics["levels"])


def grade_training_set(train: Split, classes: int, cfg: GradeConfig) -> GradeOutcome:
    """Grade ``train`` (``classes`` classes) by ``cfg``; a failed check of the grading raises GradingFailed."""
    with tqdm(total=cfg.folds + 2, desc=f"grade ({cfg.scorer}, {cfg.folds} folds)", unit="fit") as bar:
        grading, model = grade(train.images, train.labels, train.ids, cfg, progress=bar)
    scores = pd.DataFrame({"id": grading.ids.astype(str), "label": grading.labels, "score": grading.scores,
                           "level": grading.levels})
    check = validate_grading(scores, train.ids, cfg.levels)
    if not check.success:
        raise GradingFailed("grading checks failed:\n  " + "\n  ".join(check.failures))
    module_ids = {m: grading.module_ids(m, cfg.levels, cfg.curriculum, cfg.level_weight)
                  for m in range(1, cfg.levels + 1)}
    scores_of = pd.Series(grading.scores, index=grading.ids.astype(str))
    modules = [{"module": m, "count": int(len(ids)), "distinct": int(len(np.unique(ids))),
                "mean_score": float(scores_of.loc[ids.astype(str)].mean())} for m, ids in module_ids.items()]
    metrics = {"levels": grading.level_summary(classes), "modules": modules, "curriculum": cfg.curriculum,
               "mean_score": float(grading.scores.mean())}
    return GradeOutcome(grading, model, scores, module_ids, metrics)
