"""Subnetwork selection for module k. Always computes both: the static choice on the `calib` split (the
`testset` mode and the baseline: the cheapest candidate within `select.delta` of the most accurate one)
and, when the module has several Pareto candidates, a tiny predictor trained on the `route` split that
picks one per image from the incoming feature map. `select.mode` says which one the cascade (and module
k+1's input) uses. The workflow: pipeline.workflows.select."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.device import ComputeConfig, cpu_state_dict
from pipeline.io import atomic_path, write_json
from pipeline.params.config import SelectConfig, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.workflows.select import select_module
from stages.common import cli, module_number, params_of, parser


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("select", __doc__)
    p.add_argument("--module", type=module_number, required=True, help="module key mK or number k (1-based)")
    p.add_argument("--data", type=Path, required=True, help="directory written by ingest")
    p.add_argument("--profile", type=Path, required=True, help="cost model JSON")
    p.add_argument("--models", type=Path, required=True, help="directory holding m1..mK module directories")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON")
    args = p.parse_args(argv)
    params = params_of(args)
    k, name = args.module, f"m{args.module}"
    cfg = SelectConfig.from_params(params)  # checked with the params file: every key present, in range
    with stage_run(f"select@{name}", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"select": cfg.section(), "module": k}) as run, \
            atomic_path(args.models / name / "select", is_dir=True) as tmp:
        out = select_module(args.data, args.profile, args.models, k, cfg, ComputeConfig.from_params(params))
        if out.predictor is not None:
            torch.save(cpu_state_dict(out.predictor), tmp / "predictor.pt")
        write_json(tmp / "selection.json", out.selection)
        write_json(args.metrics, out.metrics)
        run.log_metrics({key: v for key, v in out.metrics.items() if isinstance(v, int | float)})
        run.set_tags({"selection_mode": out.selection["mode"]})
    print("\n".join(out.lines()))


if __name__ == "__main__":
    raise SystemExit(main())
