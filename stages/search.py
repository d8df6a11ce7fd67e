"""Method B's final pick for module k: draw k distinct subnets from the trained probability model
P(N) (uniform for the uniform-sampler ablation), evaluate each on the `route` split with the shared
weights (accuracy, perf, MACs; measured latencies go to the metrics file and MLflow only, so that
search.json is identical between identical runs), keep the best perf as the target and the accuracy-MACs
Pareto set as the routing candidates; with `search.spread` > 0, the front is taken over those draws and
as many more subnets spread across the whole space's cost range (its cheapest and largest paths and
uniform draws nearest evenly spaced costs), so the candidates span the costs routing can trade.
Plots: entropy and MI per iteration; accuracy vs MACs."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from pipeline.device import ComputeConfig, autocast, prefix_to
from pipeline.io import atomic_path, load_split, write_json
from pipeline.models.profile import LATENCY_FILE, CostModel
from pipeline.models.store import load_module
from pipeline.params.config import SearchConfig, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.routing.assemble import load_prefix
from pipeline.routing.candidates import (
    draw_candidates,
    evaluate_candidates,
    pareto_front,
    prefix_features,
    search_metrics,
    search_result,
    split_timings,
    write_search_plots,
)
from pipeline.train.config import module_train_config
from stages.common import cli, module_number, params_of, parser


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("search", __doc__)
    p.add_argument("--module", type=module_number, required=True, help="module key mK or number k (1-based)")
    p.add_argument("--data", type=Path, required=True, help="directory written by ingest")
    p.add_argument("--profile", type=Path, required=True, help="cost model JSON")
    p.add_argument("--models", type=Path, required=True, help="directory holding m1..mK module directories")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON")
    p.add_argument("--plots", type=Path, required=True, help="plots directory")
    p.add_argument("--latency", type=Path, default=None,
                   help=f"measured latency JSON of profile (default: <root>/{LATENCY_FILE}; metrics only)")
    args = p.parse_args(argv)
    params = params_of(args)
    k, name = args.module, f"m{args.module}"
    s = SearchConfig.from_params(params)  # checked with the params file (spread 0 or >= 2 included)
    seed = s.seed
    cfg = module_train_config(params, name, seed)
    compute = ComputeConfig.from_params(params)
    device = compute.resolve()
    costs = CostModel.load(args.profile, args.latency or args.root / LATENCY_FILE)
    train_dir = args.models / name / "train"
    module, info = load_module(train_dir)
    module.to(device)
    prefix = prefix_to(load_prefix(args.models, k, costs, info.mean, info.std), device)
    route = load_split(args.data, "route")
    rng = np.random.default_rng(np.random.SeedSequence([seed, k, 7]))  # P(N)'s draws, then the spread's
    model, archs, extra = draw_candidates(module, train_dir / "prob_model.json", costs, k, s.samples,
                                          s.spread, rng)
    features, labels = prefix_features(prefix, route.images, route.labels, device, compute.precision)
    with stage_run(f"search@{name}", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"search": s.section(), "module": k, "sampler": cfg.sampler}) as run:
        with autocast(device, compute.precision):
            rows, spread_rows = (evaluate_candidates(module, features, labels, group,
                                                     macs_of=lambda a: costs.macs(k, a),
                                                     latency_of=lambda a, b: costs.latency_ms(k, a, b),
                                                     cost_max=costs.max_macs(k), lambda_c=cfg.lambda_c)
                                 for group in (archs, extra))
        latency = {**split_timings(rows), **split_timings(spread_rows)}  # measured: metrics and MLflow only
        target = max(rows, key=lambda r: r["perf"])  # method B's pick: P(N)'s draws only
        front = pareto_front(rows + spread_rows, s.pareto_max)
        result = search_result(k, cfg.sampler, rows, target, front, model, spread_rows)
        out_dir = args.models / name / "search"
        with atomic_path(out_dir, is_dir=True) as tmp:
            write_json(tmp / "search.json", result)
        metrics = search_metrics(result, latency)
        write_json(args.metrics, metrics)
        with atomic_path(args.plots, is_dir=True) as tmp:
            write_search_plots(tmp, k, rows, spread_rows, front, target, train_dir / "iterations.csv")
        run.log_metrics({key: v for key, v in metrics.items() if isinstance(v, (int, float))})
        run.log_artifact(out_dir / "search.json")
        with tempfile.TemporaryDirectory() as scratch:  # every candidate's measured latency: MLflow only
            write_json(Path(scratch) / "candidate_latency.json", latency)
            run.log_artifact(Path(scratch) / "candidate_latency.json")
        run.log_artifact(args.plots, "plots")
    print(f"search@{name}: target {target['arch'] or '(fixed)'} acc {target['acc']:.4f} {target['macs']:,} MACs; "
          f"pareto {[(r['acc'], r['macs']) for r in front]}")


if __name__ == "__main__":
    raise SystemExit(main())
