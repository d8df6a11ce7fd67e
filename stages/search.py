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
import pandas as pd
import torch

from pipeline.config import ComputeConfig, TrackingConfig, section
from pipeline.device import autocast, prefix_to
from pipeline.io import atomic_path, load_split, read_json, write_json
from pipeline.models.modules import SupernetModule
from pipeline.models.profile import LATENCY_FILE, CostModel
from pipeline.models.store import load_module
from pipeline.params_schema import settings
from pipeline.plots import pareto_plot, search_curves
from pipeline.routing.assemble import load_prefix
from pipeline.search.candidates import evaluate_candidates, pareto_front, spread_archs
from pipeline.search.probmodel import ProbModel
from pipeline.tracking import stage_run
from pipeline.train.config import module_train_config
from stages.common import cli, module_number, params_of, parser

TIMING_KEYS = ("latency_ms_b1", "latency_ms_b64")  # measured: the metrics file only, never search.json


def split_timings(rows: list[dict]) -> dict[str, dict]:
    """Remove the measured latencies from candidate rows (in place); returns them by arch key."""
    return {r["arch"]: {key: r.pop(key) for key in TIMING_KEYS if key in r} for r in rows}


def search_result(k: int, sampler: str, rows: list[dict], target: dict, front: list[dict],
                  model: ProbModel | None) -> dict:
    """What ``search.json`` holds: no timing, so identical runs write identical files."""
    return {"module": k, "sampler": sampler, "samples": len(rows), "target": target, "pareto": front,
            "candidates": rows, "most_likely": model.most_likely().key() if model is not None else "",
            "entropy_final": model.entropy() if model is not None else 0.0}


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
    s = settings(params, "search")  # checked with the params file (spread 0 or >= 2 included)
    samples, max_pareto, spread = s.samples, s.pareto_max, s.spread
    seed = int(params.get("seed", 0))
    cfg = module_train_config(params, name, seed)
    compute = ComputeConfig.from_params(params)
    device = compute.resolve()
    costs = CostModel.load(args.profile, args.latency or args.root / LATENCY_FILE)
    train_dir = args.models / name / "train"
    module, info = load_module(train_dir)
    module.to(device)
    prefix = prefix_to(load_prefix(args.models, k, costs, info.mean, info.std), device)
    route = load_split(args.data, "route")
    rng = np.random.default_rng(np.random.SeedSequence([seed, k, 7]))
    if isinstance(module, SupernetModule):
        prob_path = train_dir / "prob_model.json"
        model = (ProbModel.from_dict(module.space, read_json(prob_path)) if prob_path.exists()
                 else ProbModel.uniform(module.space))
        archs = model.sample_distinct(samples, rng)
        if model.most_likely() not in archs:
            archs.append(model.most_likely())
        extra = [a for a in spread_archs(module.space, costs.table["modules"][k - 1]["op_macs"],
                                         lambda a: costs.macs(k, a), spread, rng) if a not in archs] if spread else []
    else:
        model, archs, extra = None, [module.default_arch()], []
    with torch.inference_mode(), autocast(device, compute.precision):
        batches = prefix.batches(route.images, route.labels, 512, device)
        feats, ys = zip(*((prefix(x), y) for x, y in batches), strict=True)
    features, labels = torch.cat(feats), torch.cat(ys)  # (N, C_k, H_k, W_k), (N,)
    with stage_run(f"search@{name}", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"search": dict(section(params, "search")), "module": k, "sampler": cfg.sampler}) as run:
        with autocast(device, compute.precision):
            rows, spread_rows = (evaluate_candidates(module, features, labels, group, macs_of=lambda a: costs.macs(k, a),
                                                     latency_of=lambda a, b: costs.latency_ms(k, a, b),
                                                     cost_max=costs.max_macs(k), lambda_c=cfg.lambda_c)
                                 for group in (archs, extra))
        latency = {**split_timings(rows), **split_timings(spread_rows)}
        target = max(rows, key=lambda r: r["perf"])  # method B's pick: P(N)'s draws only
        front = pareto_front(rows + spread_rows, max_pareto)
        result = search_result(k, cfg.sampler, rows, target, front, model)
        if spread_rows:
            result["spread"] = spread_rows
        out_dir = args.models / name / "search"
        with atomic_path(out_dir, is_dir=True) as tmp:
            write_json(tmp / "search.json", result)
        accs = np.array([r["acc"] for r in rows])
        metrics = {"target_acc": target["acc"], "target_macs": target["macs"], "target_perf": target["perf"],
                   "pareto_size": len(front), "acc_min": float(accs.min()), "acc_max": float(accs.max()),
                   "acc_spread": float(accs.max() - accs.min()), "entropy_final": result["entropy_final"],
                   **{f"target_{key}": v for key, v in latency[target["arch"]].items()}}
        write_json(args.metrics, metrics)
        with atomic_path(args.plots, is_dir=True) as tmp:
            every = rows + spread_rows
            pd.DataFrame(every).assign(pareto=[r in front for r in every],
                                       drawn_from=["P(N)"] * len(rows) + ["spread"] * len(spread_rows)).to_csv(
                tmp / "candidates.csv", index=False)
            pareto_plot(tmp / "acc_vs_macs.png", every, front, target, title=f"module {k}: candidates on route")
            iters = train_dir / "iterations.csv"
            if iters.exists():
                table = pd.read_csv(iters)
                table[["iteration", "entropy", "mi"]].to_csv(tmp / "entropy_mi.csv", index=False)
                search_curves(tmp / "entropy_mi.png", table, title=f"module {k}: method B training")
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
