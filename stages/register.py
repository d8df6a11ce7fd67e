"""Register the shipped model (the calibrated cascade, or the plain CNN calibrate chose instead on
held-out images) in the MLflow model registry: log it as a pyfunc model (with a
signature and a real test image as input example), register a version tagged with its lineage (git
commit, DVC md5s of this run's own inputs, dvc.lock hashes of data and params) and test metrics, point
`challenger` at it, and move `champion` to it only if it passes the gate against the current champion
(compared at equal cost when it costs more; see pipeline.registry.register.gate). Reading the champion, the
gate, the aliases and writing --out happen under the store's lock, so concurrent runs agree."""

from __future__ import annotations

from pathlib import Path

from pipeline.io import write_json
from pipeline.params.config import ParamsRecord, TrackingConfig
from pipeline.registry.register import RegisterConfig
from pipeline.registry.tracking import stage_run
from pipeline.workflows.register import CandidateMissing, RegisterInputs, read_candidate, register_candidate
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
    inputs = RegisterInputs(args.model, args.metrics_in, args.data, args.lock or args.root / "dvc.lock", args.root)
    try:
        candidate = read_candidate(inputs, {args.params.name: {"register": record.of("register")}})
    except CandidateMissing as exc:
        raise StageFailed(str(exc)) from None
    with stage_run("register", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"register": record.of("register"), "model": str(args.model)}) as run:
        decision = register_candidate(cfg, inputs, candidate, record=lambda d: write_json(args.out, d.to_dict()))
        run.log_metrics({"gate_passed": float(decision.passed), "registered_version": decision.version})
        run.set_tags({"gate": "passed" if decision.passed else "failed",
                      "gate.reasons": " | ".join(decision.reasons),
                      "registered_model": f"{cfg.model_name}/{decision.version}"})
        run.log_artifact(args.out)
    verdict = "champion" if decision.passed else f"challenger only (champion stays v{decision.champion})"
    print(f"register: {cfg.model_name} v{decision.version} is {verdict}: {'; '.join(decision.reasons)}")


if __name__ == "__main__":
    raise SystemExit(main())
