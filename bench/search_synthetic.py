"""Method B's black-box search against random search on the synthetic objective (known optimum).

Counts distinct evaluations until an arch of the top fraction (default 0.1%) is first evaluated;
a run that misses within the budget counts as the budget (so means are lower bounds for misses).
Run from the repository root: ``python -m bench.search_synthetic --repeats 20``.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.io import write_json
from pipeline.search.probmodel import SearchResult, random_search, search_blackbox
from pipeline.search.space import Arch, SearchSpace
from pipeline.search.synthetic import make_synthetic

Runner = Callable[[SearchSpace, Callable[[Arch], float], np.random.Generator], SearchResult]


@dataclass(frozen=True)
class Summary:
    method: str
    mean_evals: float
    median_evals: float
    success_rate: float
    ratio_random_over_this: float


def runners(args: argparse.Namespace) -> dict[str, Runner]:
    """The compared methods, each a function of (space, objective, generator)."""

    def method_b(entropy_selection: bool) -> Runner:
        return lambda space, f, rng: search_blackbox(
            space, f, iterations=args.budget, m=args.m, rng=rng, temperature=args.temperature,
            smoothing=args.smoothing, step=args.step, entropy_selection=entropy_selection,
            pool_factor=args.pool_factor, budget=args.budget)

    return {
        "search (entropy pick)": method_b(True),
        "search (plain pick)": method_b(False),
        "random search": lambda space, f, rng: random_search(space, f, args.budget, rng),
    }


def run(args: argparse.Namespace) -> dict[str, list[int | None]]:
    """Evaluations-to-target per method and repeat (None: missed within the budget)."""
    methods = runners(args)
    hits: dict[str, list[int | None]] = {name: [] for name in methods}
    for rep in range(args.repeats):
        objective = make_synthetic(np.random.default_rng([args.seed, rep]), args.decisions, args.choices,
                                   args.interaction)
        top = objective.top_set(args.top_fraction)
        for k, (name, runner) in enumerate(methods.items()):
            result = runner(objective.space, objective, np.random.default_rng([args.seed, rep, k]))
            hits[name].append(result.evaluations_until(top.__contains__))
    return hits


def summarise(hits: dict[str, list[int | None]], budget: int) -> list[Summary]:
    means = {name: statistics.mean(budget if h is None else h for h in hs) for name, hs in hits.items()}
    return [Summary(name, means[name], float(statistics.median(budget if h is None else h for h in hs)),
                    sum(h is not None for h in hs) / len(hs), means["random search"] / means[name])
            for name, hs in hits.items()]


def table(rows: list[Summary]) -> str:
    head = f"{'method':<24}{'mean evals':>12}{'median':>10}{'success':>10}{'random/this':>13}"
    lines = [f"{r.method:<24}{r.mean_evals:>12.1f}{r.median_evals:>10.1f}{r.success_rate:>10.0%}"
             f"{r.ratio_random_over_this:>13.2f}" for r in rows]
    return "\n".join([head, *lines])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=2000, help="distinct evaluations per run")
    p.add_argument("--decisions", type=int, default=6)
    p.add_argument("--choices", type=int, default=5)
    p.add_argument("--interaction", type=float, default=0.3, help="scale of neighbour interactions")
    p.add_argument("--top-fraction", type=float, default=0.001)
    p.add_argument("--m", type=int, default=16, help="subnets evaluated per iteration")
    p.add_argument("--temperature", type=float, default=0.2)
    p.add_argument("--smoothing", type=float, default=0.1)
    p.add_argument("--step", type=float, default=0.5)
    p.add_argument("--pool-factor", type=int, default=8)
    p.add_argument("--out", type=Path, help="optional JSON file for the settings, summary and raw counts")
    args = p.parse_args(argv)
    hits = run(args)
    rows = summarise(hits, args.budget)
    size = args.choices**args.decisions
    print(f"{args.repeats} objectives of {size} archs; target: top {args.top_fraction:.1%}; "
          f"budget {args.budget} evaluations (misses count as the budget)")
    print(table(rows))
    if args.out is not None:
        write_json(args.out, {"settings": vars(args), "summary": [asdict(r) for r in rows], "hits": hits})


if __name__ == "__main__":
    main()
