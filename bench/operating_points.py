"""Which threshold rule survives a small held-out set? Refit a finished run's cascade by each rule and
read every fit on `test` (the trained modules are the same in every row; only the rule differs; every rule
keeps the run's other `calibrate` settings, its reach floor `min_reach` among them):

  calib, estimate       the old rule: thresholds on `calib`, accuracy loss against the best exit <= delta
  pooled, estimate      the same on `route` + `calib` (both held out from module training)
  calib, bound          on `calib`, the loss bounded by its estimate + z standard errors (z = --z)
  pooled, bound         both (the pipeline's default; docs/DESIGN.md "Your own data")

    python -m bench.operating_points --repo /path/to/finished/run [--repo ...] [--z 1]

Per run and rule: test accuracy, mean MACs, the best single exit on test, the gap to it in points and
in test standard errors, and whether an exit alone dominates the fit (at <= its MACs, more than one
standard error better). Writes bench/out/operating_points.json. Nothing here chooses anything on test:
the rules are fitted on held-out images, and `test` only reports how each choice turned out.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.calibration_noise import join, score
from pipeline.io import load_split
from pipeline.params.config import CalibrateConfig, load_params
from pipeline.routing.fit import exit_outputs, fit_best_ensemble

RULES = {
    "calib, estimate": ("calib", 0.0),
    "pooled, estimate": ("pooled", 0.0),
    "calib, bound": ("calib", None),
    "pooled, bound": ("pooled", None),
}


def outputs(repo: Path) -> tuple[dict[str, Any], str, dict]:
    from pipeline.routing.package import load_cascade
    from pipeline.routing.recognize import preprocess

    model = load_cascade(repo / "models" / "cascade")
    kind = model.meta.confidence_kind
    outs = {}
    for split in ("route", "calib", "test"):
        data = load_split(repo / "data" / "prepared", split)
        logits, cum = exit_outputs(model.stages, preprocess(data.images, model.meta), kind)
        outs[split] = (logits, cum, torch.from_numpy(data.labels))
    return outs, kind, CalibrateConfig.from_params(load_params(repo / "params.yaml"))


def each_exit(test: tuple) -> list[tuple[float, float]]:
    logits, cum, y = test
    right = (logits.argmax(dim=-1) == y[:, None]).numpy()  # (N, K)
    return [(float(right[:, k].mean()), float(cum[:, k].mean())) for k in range(right.shape[1])]


def compare(repo: Path, z: float) -> dict[str, Any]:
    outs, kind, cfg = outputs(repo)
    exits = each_exit(outs["test"])
    n = len(outs["test"][2])
    best = max(a for a, _ in exits)
    rows = {}
    for name, (held_out, rule_z) in RULES.items():
        data = outs["calib"] if held_out == "calib" else join(outs["route"], outs["calib"])
        fitted = fit_best_ensemble(
            *data, replace(cfg, mode="delta", bound_z=z if rule_z is None else rule_z), kind
        )
        acc, macs = score(outs["test"], fitted["thresholds"], fitted["ensemble_decay"], kind)
        se = math.sqrt(max(acc * (1 - acc), 1e-12) / n)
        rows[name] = {
            "accuracy": acc,
            "mean_macs": macs,
            "gap_to_best_exit_pts": 100 * (best - acc),
            "gap_in_se": (best - acc) / se,
            "dominated_by_exit": [k + 1 for k, (a, m) in enumerate(exits) if m <= macs and a > acc + se],
            "held_out_images": len(data[2]),
        }
    return {"repo": str(repo), "test_images": n, "each_exit": exits, "rules": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, nargs="+", required=True, help="finished runs (repository roots)")
    p.add_argument("--z", type=float, default=1.0, help="standard errors of the bound rules (default 1)")
    p.add_argument("--out", type=Path, default=Path("bench/out/operating_points.json"))
    args = p.parse_args(argv)
    torch.set_grad_enabled(False)
    results = []
    for repo in args.repo:
        r = compare(repo, args.z)
        results.append(r)
        print(
            f"{repo.name}: {r['test_images']} test images; exits on test "
            + ", ".join(f"{100 * a:.2f}% @ {m / 1e6:.2f} M" for a, m in r["each_exit"])
        )
        for name, row in r["rules"].items():
            print(
                f"  {name:>17} ({row['held_out_images']:>5} images): {100 * row['accuracy']:.2f}% at "
                f"{row['mean_macs'] / 1e6:.2f} M, {row['gap_to_best_exit_pts']:+.2f} pts under the best exit "
                f"({row['gap_in_se']:+.2f} SE); dominated by exit {row['dominated_by_exit'] or '-'}"
            )
    summary = {
        name: {
            "mean_gap_in_se": float(np.mean([r["rules"][name]["gap_in_se"] for r in results])),
            "worst_gap_in_se": float(max(r["rules"][name]["gap_in_se"] for r in results)),
            "dominated_runs": sum(bool(r["rules"][name]["dominated_by_exit"]) for r in results),
        }
        for name in RULES
    }
    print(json.dumps(summary, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"z": args.z, "runs": results, "summary": summary}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
