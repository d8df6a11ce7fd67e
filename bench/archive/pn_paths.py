"""P(N) of each trained supernet against uniformly random paths (docs/HISTORY.md "Earlier: 8 / 8 / 6
epochs, Intel host": the supernet pays for its place).

For every supernet module of the trained pipeline (``models/modules/mK/train``): the final probability
model's entropy as a share of its maximum, and the exit accuracy on the held-out ``route`` split
of its most likely path against the median of ``--paths`` uniformly random paths (seeded), each
behind the pipeline's own frozen modules 1..K-1. Reads what ``dvc repro`` wrote; trains nothing.

Run from the repository root after ``dvc repro``: ``python -m bench.archive.pn_paths``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipeline.io import load_split, read_json, write_json
from pipeline.models.modules import SupernetModule
from pipeline.models.profile import CostModel
from pipeline.models.store import load_module
from pipeline.routing.assemble import load_prefix
from pipeline.search.picks import max_entropy
from pipeline.search.probmodel import ProbModel
from pipeline.train.paths import evaluate_path


def module_report(models: Path, k: int, costs: CostModel, split, paths: int, seed: int) -> dict | None:
    module, info = load_module(models / f"m{k}" / "train")
    if not isinstance(module, SupernetModule):
        return None
    prefix = load_prefix(models, k, costs, info.mean, info.std)
    model = ProbModel.from_dict(module.space, read_json(models / f"m{k}" / "train" / "prob_model.json"))
    rng = np.random.default_rng([seed, k])
    randoms = [module.space.from_index(tuple(int(rng.integers(len(d.choices))) for d in module.space.decisions))
               for _ in range(paths)]

    def acc(arch) -> float:
        return evaluate_path(module, prefix, split.images, split.labels, arch, 512)["acc"]

    likely = model.most_likely()
    accs = [acc(a) for a in randoms]
    return {"module": k, "entropy": model.entropy(), "entropy_share": model.entropy() / max_entropy(module.space),
            "most_likely": likely.key(), "most_likely_acc": acc(likely),
            "most_likely_macs": costs.macs(k, likely), "random_median_acc": float(np.median(accs)),
            "random_min_acc": float(np.min(accs)), "random_max_acc": float(np.max(accs)), "paths": paths}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, default=Path("models/modules"))
    p.add_argument("--data", type=Path, default=Path("data/prepared"))
    p.add_argument("--profile", type=Path, default=Path("models/profile.json"))
    p.add_argument("--paths", type=int, default=16, help="uniformly random paths per supernet")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("docs/results/pn_paths.json"))
    args = p.parse_args(argv)
    costs = CostModel.load(args.profile, None)
    split = load_split(args.data, "route")
    rows = []
    for k in sorted(int(d.name[1:]) for d in args.models.glob("m[0-9]*") if (d / "train").is_dir()):
        row = module_report(args.models, k, costs, split, args.paths, args.seed)
        if row is not None:
            rows.append(row)
            print(f"m{k}: P(N) entropy {row['entropy']:.3f} nats = {row['entropy_share']:.0%} of max; most likely "
                  f"{row['most_likely']} {row['most_likely_acc']:.2%} on route vs random median "
                  f"{row['random_median_acc']:.2%} (min {row['random_min_acc']:.2%}, max {row['random_max_acc']:.2%})")
    write_json(args.out, {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
