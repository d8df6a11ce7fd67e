"""Black-box search methods side by side: evaluations until a top-0.1% architecture is evaluated.

Benchmarks (each repeated over seeds; a miss within the budget counts as the budget):
  synthetic x1, x0.01, x100, +offset   the synthetic family (pipeline.search.synthetic), its scores
                                        scaled or shifted: a scale-free method gives identical counts
  tabular:<name>                        NAS-Bench-Graph (pip package nas-bench-graph, offline; 5 decisions
                                        of 9 choices, 26,206 networks), every encoding scored as its network
  tabular raw keys:<name>               the same, only the table's own keys valid (56% of points invalid)
Methods: ours (the default of pipeline.search.search: rank utilities, the entropy-maximising
Latin-hypercube pick, and 7 of 8 picks drawn from P around the recent best archs); as before those
picks (docs/RESULTS.md "Method B on its own": no picks around the best, restarts): ours with plain
draws of P, ours with the first entropy pick (greedy over a pool of draws, the pool shrinking with P's
entropy, and fixed), the original update (softmax(perf / T) on raw scores, T 0.2, fixed greedy pool, no
restarts: the brief's first build),
random search, a plain estimation-of-distribution baseline (50 plain draws, the best quarter,
mixed in at rate 0.1), and the NAS literature's baselines (bench/search_baselines.py): regularized
evolution (population 20, sample 10, tuned once on the synthetic family), local search (best
improvement over the one-change neighbourhood, random restarts) and Optuna's TPE (at most
--tpe-trials trials a run: its cost grows with the trials). The variants of method B (VARIANTS)
run when named in --methods. Every run stops at its first top-0.1% architecture (the counts are
those of a run to the budget), and each row gives the median's distribution-free 95% interval and,
where runs stopped without a hit (TPE at its trial cap), the median of the distinct evaluations they had
made: their true counts lie above it, which bounds a median the misses decide.

Run from the repository root: ``python -m bench.search_methods --repeats 30``. Medians of these
heavy-tailed counts move a lot between seeds; ``--pool a.json b.json`` pools the raw counts of runs
made with different ``--seed`` (and ``--out``) and prints median, mean and the ratio to a reference.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.search_baselines import TPE_TRIALS, local_search, regularized_evolution, tpe
from pipeline.io import write_json
from pipeline.search.asktell import BEFORE_40, DEFAULTS
from pipeline.search.blackbox import SearchResult, random_search, search
from pipeline.search.space import Arch, SearchSpace
from pipeline.search.synthetic import make_synthetic

Runner = Callable[..., SearchResult]  # (space, objective, budget, seed, stop) -> SearchResult

# The pick ablations and the original update are of the default before the picks around the best (BEFORE_40: none,
# restarts after 10), as docs/RESULTS.md's "Method B on its own" measured them.
_OLD = {k: v for k, v in BEFORE_40.items() if k in ("restart_after", "around", "age")}
METHODS: dict[str, Runner] = {
    "ours (default)": lambda s, f, b, seed, stop: search(s, f, budget=b, seed=seed, stop=stop),
    "ours, plain pick": lambda s, f, b, seed, stop: search(s, f, budget=b, seed=seed, pick="plain", stop=stop,
                                                           **_OLD),
    "ours, greedy pick": lambda s, f, b, seed, stop: search(s, f, budget=b, seed=seed, pick="greedy", stop=stop,
                                                            **_OLD),
    "ours, greedy pick, fixed pool": lambda s, f, b, seed, stop: search(
        s, f, budget=b, seed=seed, pick="greedy", shrink_pool=False, stop=stop, **_OLD),
    "original (softmax T=0.2)": lambda s, f, b, seed, stop: search(
        s, f, budget=b, seed=seed, m=16, pick="greedy", utility="softmax", temperature=0.2, smoothing=0.1,
        step=0.5, pool_factor=8, shrink_pool=False, restart_after=None, around=0.0, stop=stop),
    "random search": lambda s, f, b, seed, stop: random_search(s, f, budget=b, seed=seed, stop=stop),
    "EDA (50, best 1/4, 0.1)": lambda s, f, b, seed, stop: search(
        s, f, budget=b, seed=seed, m=50, pick="plain", utility="elite", step=0.1, smoothing=0.0,
        restart_after=None, around=0.0, stop=stop),
    "regularized evolution": lambda s, f, b, seed, stop: regularized_evolution(s, f, budget=b, seed=seed, stop=stop),
    "local search": lambda s, f, b, seed, stop: local_search(s, f, budget=b, seed=seed, stop=stop),
    "TPE (optuna)": lambda s, f, b, seed, stop: tpe(s, f, budget=b, seed=seed, stop=stop),
}


def _b(base: dict[str, Any], **settings: Any) -> Runner:
    """Method B with ``base`` (a settings dict of pipeline.search.asktell) updated by ``settings``."""
    kw = {k: v for k, v in (base | settings).items() if k in BEFORE_40}
    return lambda s, f, b, seed, stop: search(s, f, budget=b, seed=seed, stop=stop, **kw)


# Variants of method B tried (docs/RESULTS.md "Method B against the NAS baselines"); "before 40" is the default
# they started from (a product
# of marginals, restarts after 10, no picks around the best), the earlier variants are on top of it, the later
# ones on top of the new default. Not the default unless DEFAULTS says so.
VARIANTS: dict[str, Runner] = {
    "B, before 40": _b(BEFORE_40),
    "B, before 40, elite 4": _b(BEFORE_40, elite=4),
    "B, before 40, local 0.25": _b(BEFORE_40, local=0.25),
    "B, before 40, local 0.5": _b(BEFORE_40, local=0.5),
    "B, before 40, elite 4, local 0.25": _b(BEFORE_40, elite=4, local=0.25),
    "B, before 40, m 4": _b(BEFORE_40, m=4),
    "B, before 40, restart after 5": _b(BEFORE_40, restart_after=5),
    "B, before 40, tree": _b(BEFORE_40, structure="tree"),
    "B, before 40, tree, around 0.5 rate 0.2": _b(BEFORE_40, structure="tree", around=0.5, rate=0.2, centres=4),
    "B, before 40, around 0.5 annealed": _b(BEFORE_40, around=0.5, rate="entropy", centres=4),
    "B, before 40, around 0.5 rate 0.2": _b(BEFORE_40, around=0.5, rate=0.2, centres=4),
    "B, around 0.75 rate 0.2 centres 4": _b(DEFAULTS, around=0.75, rate=0.2, centres=4),
    "B, around 0.5": _b(DEFAULTS, around=0.5),
    "B, around 1": _b(DEFAULTS, around=1.0),
    "B, age 32": _b(DEFAULTS, age=32),
    "B, no restarts": _b(DEFAULTS, restart_after=None),
    "B, initial 24": _b(DEFAULTS, initial=24),
}
SCALES = {"synthetic x1": (1.0, 0.0), "synthetic x0.01": (0.01, 0.0), "synthetic x100": (100.0, 0.0),
          "synthetic +1000": (1.0, 1000.0)}


@dataclass(frozen=True)
class Row:
    benchmark: str
    method: str
    median: float
    mean: float
    success: float
    median_vs_random: float
    seconds: float
    runs: int = 0
    ci_low: float = float("nan")  # distribution-free 95% confidence interval of the median
    ci_high: float = float("nan")
    miss_distinct: float = float("nan")  # median distinct evaluations of the runs that missed (a TPE trial cap)


@dataclass(frozen=True)
class Problem:
    space: SearchSpace
    objective: Callable[[Arch], Any]
    target: Callable[[Arch], bool]


def synthetic_problems(scale: float, offset: float, repeats: int, seed: int) -> list[Problem]:
    out = []
    for rep in range(repeats):
        obj = make_synthetic(np.random.default_rng([seed, rep]))
        top = obj.top_set(0.001)
        out.append(Problem(obj.space, lambda a, f=obj: scale * f(a) + offset, top.__contains__))
    return out


def tabular_problems(name: str, repeats: int, raw_keys: bool = False) -> list[Problem]:
    """NAS-Bench-Graph on one dataset. By default every encoding of a network scores as the network
    (the table's canonical entry), and only the all-skip cells are invalid (None); ``raw_keys``
    scores only the table's own keys, so the 56% other encodings count as invalid points."""
    from bench.tabular_nas import load_benchmark

    bench = load_benchmark(name)
    top = bench.top_set(0.001)
    if raw_keys:
        return [Problem(bench.space, bench, lambda a: bench.space.index(a) in top)] * repeats
    canonical = functools.lru_cache(maxsize=None)(bench.canonical)

    def objective(arch: Arch) -> float | None:
        entry = canonical(arch)
        return None if entry is None else bench(entry)

    def target(arch: Arch) -> bool:
        entry = canonical(arch)
        return entry is not None and bench.space.index(entry) in top

    return [Problem(bench.space, objective, target)] * repeats


def median_ci(values: list[int] | list[float], level: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: order statistics (j, k) of the sorted values
    with P(j <= B < k) >= level for B ~ Binomial(n, 1/2) (the interval widens to the extremes for small n)."""
    x = sorted(values)
    n = len(x)
    if n == 0:
        return float("nan"), float("nan")
    cdf = np.cumsum([math.comb(n, i) / 2**n for i in range(n + 1)])
    j = max(int(np.searchsorted(cdf, (1 - level) / 2, side="right")) - 1, 0)  # P(B < j + 1) <= alpha / 2
    return float(x[j]), float(x[n - 1 - j])


def run_benchmark(name: str, problems: list[Problem], budget: int, methods: dict[str, Runner],
                  seed: int) -> tuple[list[Row], dict[str, list[int | None]]]:
    hits: dict[str, list[int | None]] = {}
    misses: dict[str, list[int]] = {}  # distinct evaluations of each run that stopped without a hit
    seconds: dict[str, float] = {}
    for method, runner in methods.items():
        t0 = time.perf_counter()
        # stopping at the target changes no count: the history up to it is the same
        results = [runner(p.space, p.objective, budget, seed * 1000 + rep, lambda e, p=p: p.target(e.arch))
                   for rep, p in enumerate(problems)]
        hits[method] = [r.evaluations_until(p.target) for r, p in zip(results, problems, strict=True)]
        misses[method] = [len(r.history) for r, h in zip(results, hits[method], strict=True) if h is None]
        seconds[method] = time.perf_counter() - t0
    counts = {m: [budget if h is None else h for h in hs] for m, hs in hits.items()}
    random_median = statistics.median(counts["random search"]) if "random search" in counts else float("nan")
    rows = [Row(name, m, float(statistics.median(c)), float(statistics.mean(c)),
                sum(h is not None for h in hits[m]) / len(c), float(statistics.median(c)) / random_median,
                seconds[m], len(c), *median_ci(c),
                float(statistics.median(misses[m])) if misses[m] else float("nan")) for m, c in counts.items()]
    return rows, hits


def table(rows: list[Row]) -> str:
    head = ("| benchmark | method | runs | median evals | 95% CI | mean | found | median / random | seconds "
            "| distinct at a miss |\n"
            "| --- | --- | ---: | ---: | :---: | ---: | ---: | ---: | ---: | ---: |")
    lines = [f"| {r.benchmark} | {r.method} | {r.runs} | {r.median:.0f} | {r.ci_low:.0f}-{r.ci_high:.0f} | "
             f"{r.mean:.0f} | {r.success:.0%} | {r.median_vs_random:.2f} | {r.seconds:.1f} | "
             f"{'-' if math.isnan(r.miss_distinct) else f'{r.miss_distinct:.0f}'} |" for r in rows]
    return "\n".join([head, *lines])


def pool_runs(files: list[Path], reference: str = "ours, plain pick") -> list[dict[str, Any]]:
    """Pool the raw counts of several ``--out`` files (runs with different ``--seed``) per benchmark and
    method: the median and mean over every run, and the median's ratio to ``reference``'s."""
    counts: dict[tuple[str, str], list[int]] = {}
    for f in files:
        data = json.loads(Path(f).read_text())
        budget = data["settings"]["budget"]
        for bench_name, methods in data["hits"].items():
            for method, hits in methods.items():
                counts.setdefault((bench_name, method), []).extend(budget if h is None else h for h in hits)
    rows = []
    for (bench_name, method), c in counts.items():
        ref = counts.get((bench_name, reference))
        rows.append({"benchmark": bench_name, "method": method, "runs": len(c), "median": statistics.median(c),
                     "mean": statistics.fmean(c),
                     "median_vs_reference": statistics.median(c) / statistics.median(ref) if ref else None})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=30, help="objectives (synthetic) or seeds (tabular)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=5000, help="distinct evaluations per run")
    p.add_argument("--benchmarks", nargs="*", default=None,
                   help="subset of names (default: every synthetic scale and every tabular benchmark)")
    p.add_argument("--methods", nargs="*", default=None,
                   help=f"subset of {list(METHODS)} and the variants {list(VARIANTS)} (default: every method)")
    p.add_argument("--tpe-trials", type=int, default=TPE_TRIALS,
                   help="TPE's trials per run (its cost grows with them; a miss counts as --budget)")
    p.add_argument("--tabular", nargs="*", default=["nbg-cora", "nbg-photo", "nbg-arxiv"],
                   help="NAS-Bench-Graph datasets, every encoding scored as its network (bench/tabular_nas.py)")
    p.add_argument("--tabular-raw", nargs="*", default=["nbg-cora"],
                   help="NAS-Bench-Graph datasets scored on the table's own keys only (others invalid)")
    p.add_argument("--out", type=Path, help="optional JSON file for settings, table rows and raw counts")
    p.add_argument("--pool", type=Path, nargs="+", metavar="JSON",
                   help="no search: pool the raw counts of earlier --out files (different --seed) and print them")
    p.add_argument("--reference", default="ours, plain pick", help="--pool: the method medians are divided by")
    args = p.parse_args(argv)
    if args.pool:
        print("| benchmark | method | runs | median evals | mean | median / reference |\n"
              "| --- | --- | ---: | ---: | ---: | ---: |")
        for r in pool_runs(args.pool, args.reference):
            ratio = "" if r["median_vs_reference"] is None else f"{r['median_vs_reference']:.2f}"
            print(f"| {r['benchmark']} | {r['method']} | {r['runs']} | {r['median']:.0f} | {r['mean']:.0f} | {ratio} |")
        return
    unknown = sorted(set(args.methods or ()) - set(METHODS) - set(VARIANTS))
    if unknown:
        p.error(f"unknown methods {unknown}; known: {list(METHODS) + list(VARIANTS)}")
    every = METHODS | VARIANTS | {"TPE (optuna)": lambda s, f, b, seed, stop: tpe(
        s, f, budget=b, seed=seed, stop=stop, trials=args.tpe_trials)}
    methods = {k: v for k, v in every.items() if (k in args.methods if args.methods else k in METHODS)}
    problems: dict[str, Callable[[], list[Problem]]] = {
        name: (lambda s=s, o=o: synthetic_problems(s, o, args.repeats, args.seed)) for name, (s, o) in SCALES.items()}
    try:
        from bench.tabular_nas import BENCHMARKS
        problems.update({f"tabular:{b}": (lambda b=b: tabular_problems(b, args.repeats)) for b in BENCHMARKS
                         if b in args.tabular})
        problems.update({f"tabular raw keys:{b}": (lambda b=b: tabular_problems(b, args.repeats, raw_keys=True))
                         for b in BENCHMARKS if b in args.tabular_raw})
    except ImportError as exc:
        print(f"tabular benchmarks skipped: {exc}")
    rows, raw = [], {}
    for name, make in problems.items():
        if args.benchmarks is not None and name not in args.benchmarks:
            continue
        found, hits = run_benchmark(name, make(), args.budget, methods, args.seed)
        rows += found
        raw[name] = hits
        print(table(found), flush=True)
    print("\n" + table(rows))
    if args.out is not None:
        write_json(args.out, {"settings": vars(args) | {"out": str(args.out)}, "rows": [asdict(r) for r in rows],
                              "hits": raw})


if __name__ == "__main__":
    main()
