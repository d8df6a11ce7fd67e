"""Method B's final pick for module k: draw k distinct subnets from the trained probability model
P(N) (uniform for the uniform-sampler ablation), evaluate each on the `route` split with the shared
weights (accuracy, perf, MACs; measured latencies go to the metrics file and MLflow only, so that
search.json is identical between identical runs), keep the best perf as the target and the accuracy-MACs
Pareto set as the routing candidates; with `search.spread` > 0, the front is taken over those draws and
as many more subnets spread across the whole space's cost range. Plots: entropy and MI per iteration;
accuracy vs MACs. The workflow: pipeline.workflows.search."""

from __future__ import annotations

import tempfile
from pathlib import Path

from pipeline.device import ComputeConfig
from pipeline.io import atomic_path, write_json
from pipeline.models.profile import LATENCY_FILE
from pipeline.params.config import SearchConfig, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.routing.candidates import write_search_plots
from pipeline.train.config import module_train_config
from pipeline.workflows.search import SearchInputs, search_module
from stages.common import cli, module_number, params_of, parser


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("search", __doc__)
    p.add_argument("--module", type=module_number, required=True, help="module key mK or number k (1-based)")
    for flag, text in (("--data", "directory written by ingest"), ("--profile", "cost model JSON"),
                       ("--models", "directory holding m1..mK module directories"),
                       ("--metrics", "metrics JSON"), ("--plots", "plots directory")):
        p.add_argument(flag, type=Path, required=True, help=text)
    p.add_argument("--latency", type=Path, default=None,
                   help=f"measured latency JSON of profile (default: <root>/{LATENCY_FILE}; metrics only)")
    args = p.parse_args(argv)
    params = params_of(args)
    k, name = args.module, f"m{args.module}"
    s = SearchConfig.from_params(params)  # checked with the params file (spread 0 or >= 2 included)
    cfg = module_train_config(params, name, s.seed)
    inputs = SearchInputs(args.data, args.profile, args.latency or args.root / LATENCY_FILE, args.models)
    with stage_run(f"search@{name}", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"search": s.section(), "module": k, "sampler": cfg.sampler}) as run:
        out = search_module(inputs, k, s, cfg, ComputeConfig.from_params(params))
        out_dir = args.models / name / "search"
        with atomic_path(out_dir, is_dir=True) as tmp:
            write_json(tmp / "search.json", out.result)
        write_json(args.metrics, out.metrics)
        with atomic_path(args.plots, is_dir=True) as tmp:
            write_search_plots(tmp, k, out.rows, out.spread_rows, out.front, out.target,
                               args.models / name / "train" / "iterations.csv")
        run.log_metrics({key: v for key, v in out.metrics.items() if isinstance(v, int | float)})
        run.log_artifact(out_dir / "search.json")
        with tempfile.TemporaryDirectory() as scratch:  # every candidate's measured latency: MLflow only
            write_json(Path(scratch) / "candidate_latency.json", out.latency)
            run.log_artifact(Path(scratch) / "candidate_latency.json")
        run.log_artifact(args.plots, "plots")
    print(out.line())


if __name__ == "__main__":
    raise SystemExit(main())
