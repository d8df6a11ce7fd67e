"""How much of the cascade's test accuracy is calibration noise, and does a steadier rule help?

    python -m bench.calibration_noise                 # models/cascade, data/prepared, params.yaml
    python -m bench.calibration_noise --repeats 50

`calibrate` fits the exit-ensemble decay and the thresholds on `calib` (3,000 images). This script
pools `route` and `calib` (6,000 held-out images, neither read by training) and refits the same
trained cascade many times, each time on other images, then reads every fit on `test`:

  calib half      the pipeline's rule on a random half of the pool (3,000 images, like `calib`)
  pooled          the same rule on a bootstrap resample of the whole pool (6,000 images)
  cross-fit       the decay chosen by 2-fold held-out accuracy (fit on one half, score on the
                  other, both ways), then thresholds fitted on both halves
  decay fixed     the pipeline's thresholds on a random half, the decay fixed at --fixed-decay

The spread of the test accuracy over the repeats is what calibration alone contributes to the
run-to-run spread of the headline figure (the trained modules are the same in every row).
Writes bench/out/calibration_noise.json.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.io import load_split, write_json
from pipeline.models.modules import confidence
from pipeline.params.config import CalibrateConfig, load_params
from pipeline.routing.calibration import simulate_thresholds
from pipeline.routing.engine import combine_exits
from pipeline.routing.fit import exit_outputs, fit, fit_best_ensemble

# (logits (N, K, C), cumulative MACs (N, K), labels (N,)): one split's exit outputs
Outputs = tuple[torch.Tensor, np.ndarray, torch.Tensor]


def take(data: Outputs, idx: np.ndarray) -> Outputs:
    logits, cum, y = data
    return logits[torch.as_tensor(idx)], cum[idx], y[torch.as_tensor(idx)]


def join(a: Outputs, b: Outputs) -> Outputs:
    return torch.cat([a[0], b[0]]), np.concatenate([a[1], b[1]]), torch.cat([a[2], b[2]])


def score(data: Outputs, thresholds: list[float], decay: float, kind: str) -> tuple[float, float]:
    """Accuracy and mean MACs of the cascade at ``thresholds`` with the ensemble of ``decay``."""
    logits, cum, y = data
    scores = combine_exits(logits, decay)
    correct = (scores.argmax(dim=-1) == y[:, None]).numpy()
    acc, macs, _ = simulate_thresholds(confidence(scores, kind).numpy(), correct, cum, thresholds)
    return float(acc), float(macs)


def rule_pipeline(data: Outputs, cfg: dict, kind: str) -> tuple[list[float], float]:
    """`calibrate`'s rule: thresholds per decay, the decay it keeps on the same data (`fit_best_ensemble`)."""
    best = fit_best_ensemble(*data, cfg, kind)
    return best["thresholds"], best["ensemble_decay"]


def rule_cross_fit(a: Outputs, b: Outputs, cfg: dict, kind: str) -> tuple[list[float], float]:
    """The decay whose thresholds score best on the other half (both ways, summed); thresholds
    for it refitted on both halves. Ties go to the smaller decay."""
    held_out = {}
    for d in map(float, cfg.ensemble_decays):
        held_out[d] = sum(score(z, fit(*x, cfg, kind, d)["thresholds"], d, kind)[0] for x, z in ((a, b), (b, a)))
    decay = max(sorted(held_out), key=lambda d: held_out[d])
    return fit(*join(a, b), cfg, kind, decay)["thresholds"], decay


def summarise(rows: list[tuple[float, float, float]]) -> dict[str, Any]:
    acc = [r[0] for r in rows]
    return {"test_accuracy_mean": statistics.fmean(acc), "test_accuracy_sd": statistics.pstdev(acc),
            "test_accuracy_min": min(acc), "test_accuracy_max": max(acc),
            "mean_macs": statistics.fmean(r[1] for r in rows),
            "decays": {f"{d:g}": n for d, n in sorted(Counter(r[2] for r in rows).items())}}


def run(route: Outputs, calib: Outputs, test: Outputs, cfg: dict, kind: str, repeats: int, seed: int,
        fixed_decay: float) -> dict[str, Any]:
    pool = join(route, calib)
    n, half = len(pool[2]), len(calib[2])
    rng = np.random.default_rng(seed)
    rules: dict[str, Callable[[np.ndarray], tuple[list[float], float]]] = {
        "calib half": lambda perm: rule_pipeline(take(pool, perm[:half]), cfg, kind),
        "pooled": lambda perm: rule_pipeline(take(pool, rng.integers(0, n, n)), cfg, kind),
        "cross-fit": lambda perm: rule_cross_fit(take(pool, perm[:half]), take(pool, perm[half:]), cfg, kind),
        "decay fixed": lambda perm: (fit(*take(pool, perm[:half]), cfg, kind, fixed_decay)["thresholds"],
                                     fixed_decay),
    }
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in rules}
    for _ in range(repeats):
        perm = rng.permutation(n)
        for name, rule in rules.items():
            thresholds, decay = rule(perm)
            rows[name].append((*score(test, thresholds, decay, kind), decay))
    thresholds, decay = rule_pipeline(calib, cfg, kind)
    acc, macs = score(test, thresholds, decay, kind)
    return {"the run's calib": {"test_accuracy": acc, "mean_macs": macs, "decay": decay},
            **{name: summarise(r) for name, r in rows.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=Path("models/cascade"))
    p.add_argument("--data", type=Path, default=Path("data/prepared"))
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--repeats", type=int, default=20, help="refits per rule")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fixed-decay", type=float, default=0.5)
    p.add_argument("--out", type=Path, default=Path("bench/out/calibration_noise.json"))
    args = p.parse_args(argv)
    from pipeline.routing.package import load_cascade
    from pipeline.routing.recognize import preprocess

    cfg = CalibrateConfig.from_params(load_params(args.params))
    model = load_cascade(args.model)
    kind = model.meta.confidence_kind
    torch.set_grad_enabled(False)
    outs = {}
    for split in ("route", "calib", "test"):
        data = load_split(args.data, split)
        logits, cum = exit_outputs(model.stages, preprocess(data.images, model.meta), kind)
        outs[split] = (logits, cum, torch.from_numpy(data.labels))
    result = run(outs["route"], outs["calib"], outs["test"], cfg, kind, args.repeats, args.seed, args.fixed_decay)
    for name, r in result.items():
        if "test_accuracy_mean" in r:
            print(f"{name:>12}: test {100 * r['test_accuracy_mean']:.2f}% (sd {100 * r['test_accuracy_sd']:.2f}, "
                  f"{100 * r['test_accuracy_min']:.2f}-{100 * r['test_accuracy_max']:.2f}) at "
                  f"{r['mean_macs'] / 1e6:.2f} M; decays {r['decays']}")
        else:
            print(f"{name:>12}: test {100 * r['test_accuracy']:.2f}% at {r['mean_macs'] / 1e6:.2f} M, "
                  f"decay {r['decay']:g}")
    write_json(args.out, {"model": str(args.model), "repeats": args.repeats, "calibrate": cfg.section(),
                          "rules": result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
