"""Grade the difficulty of every training image (1 - out-of-fold p(true class) from a cheap
scikit-learn model), bin the scores into levels, and write one training id list per module by the
curriculum. Checks the grading with Great Expectations; writes metrics, plots and the grading model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from pipeline.data.grader_store import GRADER_FILE, save_grader
from pipeline.data.grading import grade
from pipeline.data.validation import validate_grading
from pipeline.io import atomic_path, load_split, read_json, write_json
from pipeline.params.config import GradeConfig, ParamsRecord, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.report.plots import level_examples, score_histogram
from stages.common import StageFailed, cli, params_of, parser


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("grade", __doc__)
    p.add_argument("--data", type=Path, required=True, help="directory written by the ingest stage")
    p.add_argument("--validation", type=Path, required=True, help="validation summary (must have passed)")
    p.add_argument("--out", type=Path, required=True, help="output directory: scores, id lists, grading model")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON")
    p.add_argument("--plots", type=Path, required=True, help="plots directory (PNG and CSV)")
    args = p.parse_args(argv)
    params = params_of(args)
    cfg = GradeConfig.from_params(params)
    failed = [name for name, r in read_json(args.validation).items() if not r["success"]]
    if failed:
        raise StageFailed(f"validation failed for {failed}; fix the data before grading")
    meta = read_json(args.data / "meta.json")
    classes = meta["classes"]
    train = load_split(args.data, "train")
    with stage_run("grade", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"grade": ParamsRecord.from_params(params).of("grade"), "seed": cfg.seed}) as run:
        with tqdm(total=cfg.folds + 2, desc=f"grade ({cfg.scorer}, {cfg.folds} folds)", unit="fit") as bar:
            grading, model = grade(train.images, train.labels, train.ids, cfg, progress=bar)
        scores = pd.DataFrame({"id": grading.ids.astype(str), "label": grading.labels,
                               "score": grading.scores, "level": grading.levels})
        check = validate_grading(scores, train.ids, cfg.levels)
        if not check.success:
            raise StageFailed("grading checks failed:\n  " + "\n  ".join(check.failures))

        with atomic_path(args.out, is_dir=True) as tmp:
            scores.to_csv(tmp / "scores.csv", index=False, float_format="%.6f")
            for module in range(1, cfg.levels + 1):
                ids = grading.module_ids(module, cfg.levels, cfg.curriculum, cfg.level_weight)
                (tmp / f"m{module}.txt").write_text("\n".join(ids.astype(str)) + "\n")
            save_grader(tmp / GRADER_FILE, model)  # arrays, not a pickle: data/graded is shared

        summary = grading.level_summary(len(classes))
        modules = []
        for module in range(1, cfg.levels + 1):
            ids = grading.module_ids(module, cfg.levels, cfg.curriculum, cfg.level_weight)
            scores_of = pd.Series(grading.scores, index=grading.ids.astype(str))
            modules.append({"module": module, "count": int(len(ids)), "distinct": int(len(np.unique(ids))),
                            "mean_score": float(scores_of.loc[ids.astype(str)].mean())})
        metrics = {"levels": summary, "modules": modules, "curriculum": cfg.curriculum,
                   "mean_score": float(grading.scores.mean())}
        write_json(args.metrics, metrics)
        with atomic_path(args.plots, is_dir=True) as tmp:
            score_histogram(tmp / "score_hist.png", grading.scores, grading.levels)
            level_examples(tmp / "examples.png", train.images, train.labels, grading.levels, classes,
                           seed=cfg.seed)
            edges = np.linspace(0, 1, 41)
            rows = [{"score": round(float((edges[i] + edges[i + 1]) / 2), 4), "level": f"level {lv}",
                     "count": int(n)}
                    for lv in range(1, cfg.levels + 1)
                    for i, n in enumerate(np.histogram(grading.scores[grading.levels == lv], edges)[0])]
            pd.DataFrame(rows).to_csv(tmp / "score_hist.csv", index=False)
        for level in summary:
            run.log_metrics({f"level{level['level']}_count": level["count"],
                             f"level{level['level']}_mean_score": level["mean_score"]})
        for module in modules:
            run.log_metrics({f"module{module['module']}_train_count": module["count"]})
        run.log_artifact(args.plots, "plots")
        run.log_artifact(args.metrics)
    print("grade: " + ", ".join(f"L{s['level']}: n={s['count']} mean={s['mean_score']:.3f}" for s in summary))


if __name__ == "__main__":
    raise SystemExit(main())
