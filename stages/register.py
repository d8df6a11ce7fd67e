"""Register the shipped model (the calibrated cascade, or the plain CNN calibrate chose instead on
held-out images) in the MLflow model registry: log it as a pyfunc model (with a
signature and a real test image as input example), register a version tagged with its lineage (git
commit, DVC md5s of this run's own inputs, dvc.lock hashes of data and params) and test metrics, point
`challenger` at it, and move `champion` to it only if it passes the gate against the current champion
(compared at equal cost when it costs more; see pipeline.registry.register.gate). Reading the champion, the
gate, the aliases and writing --out happen under the store's lock, so concurrent runs agree."""

from __future__ import annotations

from pathlib import Path

from pipeline.io import load_split, read_json, write_json
from pipeline.params.config import ParamsRecord, TrackingConfig
from pipeline.registry.register import RegisterConfig, image_frame, log_version, promote
from pipeline.registry.shipped import dominated_veto, gate_candidate, shipped_figures, version_tags
from pipeline.registry.tracking import stage_run
from stages.common import StageFailed, cli, params_of, parser


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("register", __doc__)
    p.add_argument("--model", type=Path, required=True,
                   help="the shipped model (model directory written by calibrate)")
    p.add_argument("--metrics-in", type=Path, required=True,
                   help="evaluate's metrics JSON (key 'cascade'; 'each_exit' and 'budget_curve' if present)")
    p.add_argument("--data", type=Path, required=True, help="directory written by ingest (input example)")
    p.add_argument("--lock", type=Path, default=None,
                   help="dvc.lock read for lineage tags (default: ROOT/dvc.lock)")
    p.add_argument("--out", type=Path, required=True, help="metrics JSON: the gate decision and its reasons")
    args = p.parse_args(argv)
    params = params_of(args)
    cfg, record = RegisterConfig.from_params(params), ParamsRecord.from_params(params)
    evaluated = read_json(args.metrics_in)
    shipped, figures, missing = shipped_figures(evaluated)
    if missing:
        raise StageFailed(f"{args.metrics_in} has no {shipped} {', '.join(missing)}")
    candidate, curve = gate_candidate(evaluated, shipped, figures)
    tags = version_tags(args.root, args.lock or args.root / "dvc.lock", candidate,
                        (args.model, args.metrics_in, args.data / "test.npz"),
                        {args.params.name: {"register": record.of("register")}})
    example = image_frame(load_split(args.data, "test").images[:1])
    classes = read_json(args.model / "cascade.json")["meta"]["classes"]  # what the gate compares first
    with stage_run("register", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"register": record.of("register"), "model": str(args.model)}) as run:
        model_uri = log_version(args.model, example)
        decision = promote(cfg, model_uri, candidate, tags, curve=curve, root=args.root,
                           record=lambda d: write_json(args.out, d.to_dict()), classes=classes,
                           veto=dominated_veto(evaluated))
        run.log_metrics({"gate_passed": float(decision.passed), "registered_version": decision.version})
        run.set_tags({"gate": "passed" if decision.passed else "failed",
                      "gate.reasons": " | ".join(decision.reasons),
                      "registered_model": f"{cfg.model_name}/{decision.version}"})
        run.log_artifact(args.out)
    verdict = "champion" if decision.passed else f"challenger only (champion stays v{decision.champion})"
    print(f"register: {cfg.model_name} v{decision.version} is {verdict}: {'; '.join(decision.reasons)}")


if __name__ == "__main__":
    raise SystemExit(main())
