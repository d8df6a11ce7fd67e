"""Grade the difficulty of every training image (1 - out-of-fold p(true class) from a cheap
scikit-learn model), bin the scores into levels, and write one training id list per module by the
curriculum. Checks the grading with Great Expectations; writes metrics, plots and the grading model.
The workflow: pipeline.workflows.grade."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipeline.data.grader_store import GRADER_FILE, save_grader
from pipeline.io import atomic_path, load_split, read_json, write_json
from pipeline.params.config import GradeConfig, ParamsRecord, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.report.plots import level_examples, score_histogram
from pipeline.workflows.grade import GradingFailed, grade_training_set
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
    classes = read_json(args.data / "meta.json")["classes"]
    train = load_split(args.data, "train")
    with stage_run("grade", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"grade": ParamsRecord.from_params(params).of("grade"), "seed": cfg.seed}) as run:
        try:
            out = grade_training_set(train, len(classes), cfg)
        except GradingFailed as exc:
            raise StageFailed(str(exc)) from None
        with atomic_path(args.out, is_dir=True) as tmp:
            out.scores.to_csv(tmp / "scores.csv", index=False, float_format="%.6f")
            for module, ids in out.module_ids.items():
                (tmp / f"m{module}.txt").write_text("\n".join(ids.astype(str)) + "\n")
            save_grader(tmp / GRADER_FILE, out.model)  # arrays, not a pickle: data/graded is shared
        write_json(args.metrics, out.metrics)
        with atomic_path(args.plots, is_dir=True) as tmp:
            score_histogram(tmp / "score_hist.png", out.grading.scores, out.grading.levels)
            level_examples(tmp / "examples.png", train.images, train.labels, out.grading.levels, classes,
                           seed=cfg.seed)
            pd.DataFrame(out.score_histogram_rows()).to_csv(tmp / "score_hist.csv", index=False)
        run.log_metrics(out.run_metrics())
        run.log_artifact(args.plots, "plots")
        run.log_artifact(args.metrics)
    print(out.line())


if __name__ == "__main__":
    raise SystemExit(main())
