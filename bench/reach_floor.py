"""What a reach floor costs: refit a finished run's cascade by the pipeline's rule (the run's params'
`calibrate` section, on its held-out images) at each floor of ``--floors`` (`calibrate.min_reach`: every
module gets at least that share of the held-out images) and read each fit on `test`.

    python -m bench.reach_floor --repo /path/to/finished/run [--repo ...] [--floors 0 0.02 0.04 0.06 0.08]

Per run and floor: the held-out fit (accuracy, MACs, each module's reach, the decay kept) and the same
thresholds read on test (accuracy, MACs, each module's reach). Writes bench/out/reach_floor.json. The
trained modules are the same in every row; only the floor differs. Nothing here chooses anything on test.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bench.calibration_noise import join
from pipeline.models.modules import confidence
from pipeline.params.config import CalibrateConfig
from pipeline.routing.calibration import reach_shares, simulate_thresholds
from pipeline.routing.engine import combine_exits
from pipeline.routing.fit import fit_best_ensemble

Outputs = tuple[torch.Tensor, Any, torch.Tensor]  # logits (N, K, C), cumulative MACs (N, K), labels (N,)


def read(data: Outputs, thresholds: list[float], decay: float, kind: str) -> dict[str, Any]:
    """The cascade at ``thresholds`` (exit ensemble of ``decay``) on ``data``: accuracy, mean MACs, reach."""
    logits, cum, y = data
    scores = combine_exits(logits, decay)  # (N, K, C)
    correct = (scores.argmax(dim=-1) == y[:, None]).numpy()  # (N, K)
    accuracy, mean_macs, counts = simulate_thresholds(confidence(scores, kind).numpy(), correct, cum, thresholds)
    return {"accuracy": accuracy, "mean_macs": mean_macs, "exit_counts": counts.tolist(),
            "reach": reach_shares(counts)}


def floors_table(held_out: Outputs, test: Outputs, cfg: CalibrateConfig, kind: str, floors: list[float]) -> list[dict]:
    """One row per floor: the rule's fit on ``held_out`` and its reading on ``test``."""
    rows = []
    for floor in floors:
        fitted = fit_best_ensemble(*held_out, replace(cfg, min_reach=floor), kind)
        rows.append({"min_reach": floor, "ensemble_decay": fitted["ensemble_decay"],
                     "thresholds": fitted["thresholds"],
                     "held_out": {"accuracy": fitted["accuracy"], "mean_macs": fitted["mean_macs"],
                                  "reach": fitted["reach"]},
                     "test": read(test, fitted["thresholds"], fitted["ensemble_decay"], kind)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, nargs="+", required=True, help="finished runs (repository roots)")
    p.add_argument("--floors", type=float, nargs="+", default=[0.0, 0.02, 0.04, 0.06, 0.08],
                   help="values of calibrate.min_reach to fit (default 0 0.02 0.04 0.06 0.08)")
    p.add_argument("--out", type=Path, default=Path("bench/out/reach_floor.json"))
    args = p.parse_args(argv)
    from bench.operating_points import outputs

    torch.set_grad_enabled(False)
    results = []
    for repo in args.repo:
        outs, kind, cfg = outputs(repo)
        held_out = outs["calib"] if cfg.held_out == "calib" else join(outs["route"], outs["calib"])
        rows = floors_table(held_out, outs["test"], cfg, kind, args.floors)
        results.append({"repo": str(repo), "held_out_images": len(held_out[2]), "rows": rows})
        print(f"{repo.name}: {len(held_out[2])} held-out images, {len(outs['test'][2])} test images")
        for r in rows:
            h, t = r["held_out"], r["test"]
            print(f"  floor {r['min_reach']:.0%}: decay {r['ensemble_decay']:g}; held out {100 * h['accuracy']:.2f}% "
                  f"at {h['mean_macs'] / 1e6:.3f} M; test {100 * t['accuracy']:.2f}% at {t['mean_macs'] / 1e6:.3f} M, "
                  f"modules reached by {' / '.join(f'{100 * s:.1f}%' for s in t['reach'])}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"floors": args.floors, "runs": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
