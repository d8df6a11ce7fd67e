"""The search stage's workflow (``stages.search`` parses, calls :func:`search_module`, writes and prints):
method B's final pick for module k, its draws from the trained P(N) evaluated on `route` behind the frozen
prefix, and the accuracy-MACs Pareto candidates routing chooses among (docs/DESIGN.md "Stages and
workflows")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.device import ComputeConfig, autocast, prefix_to
from pipeline.io import load_split
from pipeline.models.profile import CostModel
from pipeline.models.store import load_module
from pipeline.params.config import SearchConfig
from pipeline.routing.assemble import load_prefix
from pipeline.routing.candidates import (
    draw_candidates,
    evaluate_candidates,
    pareto_front,
    prefix_features,
    search_metrics,
    search_result,
    split_timings,
)
from pipeline.train.config import TrainConfig


@dataclass(frozen=True)
class SearchInputs:
    data: Path  # written by ingest (its route split)
    profile: Path  # the cost model
    latency: Path  # profile's measured latencies (metrics only)
    models: Path  # m1..mK module directories


@dataclass(frozen=True)
class SearchOutcome:
    k: int
    result: dict[str, Any]  # search.json: identical between identical runs (no timings)
    metrics: dict[str, Any]  # the metrics file
    latency: dict[str, Any]  # every candidate's measured latency: MLflow only
    rows: list[dict]  # P(N)'s draws, evaluated
    spread_rows: list[dict]  # the subnets spread over the cost range, evaluated
    front: list[dict]  # the Pareto candidates
    target: dict  # method B's pick: the best perf among P(N)'s draws

    def line(self) -> str:
        t = self.target
        return (f"search@m{self.k}: target {t['arch'] or '(fixed)'} acc {t['acc']:.4f} {t['macs']:,} MACs; "
                f"pareto {[(r['acc'], r['macs']) for r in self.front]}")


def search_module(inputs: SearchInputs, k: int, s: SearchConfig, cfg: TrainConfig,
                  compute: ComputeConfig) -> SearchOutcome:
    """Draw ``s.samples`` subnets of module k from P(N) (and ``s.spread`` across the cost range), evaluate
    them on `route` and keep at most ``s.pareto_max`` Pareto candidates; ``cfg``: the module's recipe
    (its sampler and the cost weight of perf)."""
    device = compute.resolve()
    costs = CostModel.load(inputs.profile, inputs.latency)
    train_dir = inputs.models / f"m{k}" / "train"
    module, info = load_module(train_dir)
    module.to(device)
    prefix = prefix_to(load_prefix(inputs.models, k, costs, info.mean, info.std), device)
    route = load_split(inputs.data, "route")
    rng = np.random.default_rng(np.random.SeedSequence([s.seed, k, 7]))  # P(N)'s draws, then the spread's
    model, archs, extra = draw_candidates(module, train_dir / "prob_model.json", costs, k, s.samples, s.spread, rng)
    features, labels = prefix_features(prefix, route.images, route.labels, device, compute.precision)
    with autocast(device, compute.precision):
        rows, spread_rows = (evaluate_candidates(module, features, labels, group, macs_of=lambda a: costs.macs(k, a),
                                                 latency_of=lambda a, b: costs.latency_ms(k, a, b),
                                                 cost_max=costs.max_macs(k), lambda_c=cfg.lambda_c)
                             for group in (archs, extra))
    latency = {**split_timings(rows), **split_timings(spread_rows)}
    target = max(rows, key=lambda r: r["perf"])  # method B's pick: P(N)'s draws only
    front = pareto_front(rows + spread_rows, s.pareto_max)
    result = search_result(k, cfg.sampler, rows, target, front, model, spread_rows)
    return SearchOutcome(k, result, search_metrics(result, latency), latency, rows, spread_rows, front, target)
