"""Subnetwork selection for module k (claims 7 and 8). Always computes both: the static choice on the
`calib` split (claim 8, the `testset` mode and the baseline: the cheapest candidate within
`select.delta` of the most accurate one) and, when the module has several Pareto
candidates, a tiny predictor trained on the `route` split (claim 7) that picks one per image from the
incoming feature map. `select.mode` says which one the cascade (and module k+1's input) uses."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.device import ComputeConfig, autocast, cpu_state_dict, prefix_to
from pipeline.io import atomic_path, load_split, read_json, write_json
from pipeline.models.profile import CostModel
from pipeline.models.store import load_module
from pipeline.params.config import SelectConfig, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.routing.assemble import load_prefix
from pipeline.routing.features import candidate_outputs, split_features
from pipeline.routing.selection import PredictorConfig, routed_selection, static_selection
from pipeline.search.space import Arch
from stages.common import cli, module_number, params_of, parser

MODES = ("predictor", "testset")


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
    mode, hidden, epochs, max_share = cfg.mode, cfg.hidden, cfg.epochs, float(cfg.max_macs_share)
    fallback_tolerance, scoring, pool, delta = float(cfg.fallback_tolerance), cfg.scoring, cfg.pool, float(cfg.delta)
    seed = cfg.seed
    compute = ComputeConfig.from_params(params)
    device = compute.resolve()
    costs = CostModel(read_json(args.profile))
    module, info = load_module(args.models / name / "train")
    module.to(device)
    search = read_json(args.models / name / "search" / "search.json")
    archs = [Arch.from_key(r["arch"]) for r in search["pareto"]]
    macs = [costs.macs(k, a) for a in archs]
    prefix = prefix_to(load_prefix(args.models, k, costs, info.mean, info.std), device)
    calib_h, calib_y = split_features(prefix, load_split(args.data, "calib"), device=device,
                                      precision=compute.precision)
    with autocast(device, compute.precision):
        c_correct, _, _ = candidate_outputs(module, calib_h, calib_y, archs)
    selection, metrics, static = static_selection(k, mode, archs, macs, c_correct, delta)
    with stage_run(f"select@{name}", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"select": cfg.section(), "module": k}) as run, \
            atomic_path(args.models / name / "select", is_dir=True) as tmp:
        if mode == "testset" or len(archs) == 1:
            selection["mode"] = "testset" if len(archs) > 1 else "single"
        else:
            route_h, route_y = split_features(prefix, load_split(args.data, "route"), device=device,
                                              precision=compute.precision)
            with autocast(device, compute.precision):
                r_correct, r_p_true, _ = candidate_outputs(module, route_h, route_y, archs)
            selection, metrics, predictor = routed_selection(
                selection, metrics, static, route_h, r_correct, r_p_true, macs, PredictorConfig(
                    scoring=scoring, hidden=hidden, pool=pool, epochs=epochs, balanced=cfg.balanced,
                    seed=seed + k, tolerance=fallback_tolerance), max_share, name)
            torch.save(cpu_state_dict(predictor), tmp / "predictor.pt")
        write_json(tmp / "selection.json", selection)
        write_json(args.metrics, metrics)
        run.log_metrics({key: v for key, v in metrics.items() if isinstance(v, (int, float))})
        run.set_tags({"selection_mode": selection["mode"]})
    if selection["predictor"] and not metrics["predictor_used"]:
        print(f"select@{name}: predictor routing {metrics['predictor_routed_acc_heldout']:.4f} at "
              f"{metrics['predictor_mean_macs_heldout']:,.0f} MACs does not pay against the static choice "
              f"{metrics['static_acc_heldout']:.4f} at {metrics['static_macs']:,} MACs on held-out route: "
              "static serves")
    static_key = selection["static"] or "(fixed)"
    print(f"select@{name}: mode {selection['mode']}, {len(archs)} candidates, static {static_key}"
          + (f", {scoring} predictor routes {metrics['predictor_routed_acc_heldout']:.4f} right (held-out route), "
             f"{metrics['predictor_macs']:,} MACs" if selection["predictor"] else ""))


if __name__ == "__main__":
    raise SystemExit(main())
