"""Wall time of search() serial against search(..., executor=ThreadPoolExecutor(workers)) on an objective
that sleeps (a stand-in for an expensive evaluation), on one synthetic objective, same seed.

Run from the repository root: ``python -m bench.search_parallel`` (about budget x sleep x 1.3 seconds).
It checks that both runs evaluated the same points in the same order and prints the wall-time ratio
(the target in docs/RESULTS.md "Method B against the NAS baselines": <= 0.35 with 4 workers and 0.2 s per
evaluation).
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pipeline.search import search
from pipeline.search.synthetic import make_synthetic


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--sleep", type=float, default=0.2, help="seconds per evaluation")
    p.add_argument("--budget", type=int, default=64, help="distinct evaluations per run")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    objective = make_synthetic(np.random.default_rng(args.seed))

    def evaluate(arch):
        time.sleep(args.sleep)
        return objective(arch)

    t0 = time.perf_counter()
    serial = search(objective.space, evaluate, budget=args.budget, seed=args.seed)
    t1 = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as pool:
        parallel = search(objective.space, evaluate, budget=args.budget, seed=args.seed, executor=pool)
    t2 = time.perf_counter()
    same = [e.arch for e in serial.history] == [e.arch for e in parallel.history]
    iterations = len({e.iteration for e in serial.history})
    print(f"{args.budget} evaluations in {iterations} iterations ({args.budget / iterations:.1f} new points each), "
          f"{args.sleep} s each: serial {t1 - t0:.2f} s, {args.workers} workers {t2 - t1:.2f} s, "
          f"ratio {(t2 - t1) / (t1 - t0):.3f}; same history: {same}")


if __name__ == "__main__":
    main()
