"""Validate the ingested splits with Great Expectations: labels in the class set, unique ids, no image
in two splits, class shares within tolerance, pixel statistics in range, counts equal to the meta.
Writes one JSON result per suite (the DVC output) and the GX data docs (beside it, not a DVC output:
GX stamps them with the run's time, so they would make identical reruns differ in dvc.lock); any failed
expectation exits non-zero."""

from __future__ import annotations

from pathlib import Path

from pipeline.io import atomic_path, write_json
from pipeline.params.config import ParamsRecord, TrackingConfig, ValidateConfig
from pipeline.registry.tracking import stage_run
from pipeline.workflows.validate import summary, validate_data
from stages.common import StageFailed, cli, params_of, parser


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("validate", __doc__)
    p.add_argument("--data", type=Path, required=True, help="directory written by the ingest stage")
    p.add_argument("--out", type=Path, required=True, help="output directory: per-suite JSON and summary.json")
    p.add_argument("--docs", type=Path, default=Path("reports/data_docs"),
                   help="where to write the GX data docs (an HTML site; default: %(default)s)")
    args = p.parse_args(argv)
    params = params_of(args)
    cfg = ValidateConfig.from_params(params)
    with stage_run("validate", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"validate": ParamsRecord.from_params(params).of("validate")}) as run:
        with atomic_path(args.out, is_dir=True) as tmp, atomic_path(args.docs, is_dir=True) as docs_tmp:
            results = validate_data(args.data, cfg, docs_tmp)
            for name, res in results.items():
                write_json(tmp / f"{name}.json", res.raw)
            write_json(tmp / "summary.json", summary(results))
        run.log_metrics({f"{name}_success": int(r.success) for name, r in results.items()})
        run.log_artifact(args.out / "summary.json")
        run.log_artifact(args.docs, "data_docs")
        failures = [f for r in results.values() for f in r.failures]
        run.set_tags({"validation": "failed" if failures else "passed"})
    if failures:
        raise StageFailed("data validation failed:\n  " + "\n  ".join(failures))
    print(f"validate: {len(results)} suites passed; data docs in {args.docs / 'index.html'}")


if __name__ == "__main__":
    raise SystemExit(main())
