"""Register the calibrated cascade in the MLflow model registry: log it as a pyfunc model (with a
signature and a real test image as input example), register a version tagged with its lineage (git
commit, dvc.lock hashes of data and params) and test metrics, point `challenger` at it, and move
`champion` to it only if it passes the gate against the current champion."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import TrackingConfig
from pipeline.io import load_split, read_json, write_json
from pipeline.registry import GATE_METRICS, RegisterConfig, image_frame, lineage_tags, register_cascade
from pipeline.tracking import stage_run
from stages.common import StageFailed, cli, params_of, parser


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("register", __doc__)
    p.add_argument("--model", type=Path, required=True, help="calibrated cascade (model directory)")
    p.add_argument("--metrics-in", type=Path, required=True, help="evaluate's metrics JSON (key 'cascade')")
    p.add_argument("--data", type=Path, required=True, help="directory written by ingest (input example)")
    p.add_argument("--lock", type=Path, default=None,
                   help="dvc.lock read for lineage tags (default: ROOT/dvc.lock)")
    p.add_argument("--out", type=Path, required=True, help="metrics JSON: the gate decision and its reasons")
    args = p.parse_args(argv)
    params = params_of(args)
    cfg = RegisterConfig.from_params(params)
    evaluated = read_json(args.metrics_in).get("cascade") or {}
    missing = [key for key in GATE_METRICS if not isinstance(evaluated.get(key), int | float)]
    if missing:
        raise StageFailed(f"{args.metrics_in} has no cascade {', '.join(missing)}")
    candidate = {key: float(evaluated[key]) for key in GATE_METRICS}
    tags = lineage_tags(args.root, args.lock or args.root / "dvc.lock", candidate)
    example = image_frame(load_split(args.data, "test").images[:1])
    with stage_run("register", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"register": params["register"], "model": str(args.model)}) as run:
        decision = register_cascade(args.model, cfg, candidate, tags, example, root=args.root)
        write_json(args.out, decision.to_dict())
        run.log_metrics({"gate_passed": float(decision.passed), "registered_version": decision.version})
        run.set_tags({"gate": "passed" if decision.passed else "failed",
                      "gate.reasons": " | ".join(decision.reasons),
                      "registered_model": f"{cfg.model_name}/{decision.version}"})
        run.log_artifact(args.out)
    verdict = "champion" if decision.passed else f"challenger only (champion stays v{decision.champion})"
    print(f"register: {cfg.model_name} v{decision.version} is {verdict}: {'; '.join(decision.reasons)}")


if __name__ == "__main__":
    raise SystemExit(main())
