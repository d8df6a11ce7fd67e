"""A model's operating points read on the test split: for each point the model carries (`cascade info`),
the engine run at its thresholds over every test image, beside the held-out figures the point was fitted
with. What a per-request budget gets (docs/DESIGN.md 'Serving'): the point's mean MACs on unseen images
against its held-out figure, and its accuracy.

    python -m bench.points_on_test --model models/cascade --data data/prepared
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from pipeline.io import load_split
from pipeline.routing.engine import run_cascade
from pipeline.routing.package import load_cascade
from pipeline.routing.recognize import preprocess


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=Path("models/cascade"))
    p.add_argument("--data", type=Path, default=Path("data/prepared"))
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    model = load_cascade(args.model, torch.device("cpu"))
    points = model.meta.operating_points
    if not points:
        raise SystemExit(f"bench.points_on_test: {args.model} carries no operating points (re-run calibrate)")
    test = load_split(args.data, "test")
    x, y = preprocess(test.images, model.meta), torch.from_numpy(test.labels)
    rows = []
    with torch.inference_mode():
        for point in points:
            out = run_cascade(model.stages, x, confidence_kind=model.meta.confidence_kind, batch_size=512,
                              ensemble_decay=model.meta.ensemble_decay, thresholds=point.thresholds)
            acc = float((out.pred == y).float().mean())
            macs = float(out.macs.double().mean())
            rows.append({"point": point.name, "held_out_accuracy": point.accuracy,
                         "held_out_mean_macs": point.mean_macs,
                         "test_accuracy": acc, "test_se": math.sqrt(acc * (1 - acc) / len(y)), "test_mean_macs": macs,
                         "macs_vs_held_out": macs / point.mean_macs - 1})
            r = rows[-1]
            print(f"{point.name:>9}: held out {100 * point.accuracy:6.2f}% at {point.mean_macs / 1e6:5.3f} M | test "
                  f"{100 * acc:6.2f}% (SE {100 * r['test_se']:.2f}) at {macs / 1e6:5.3f} M "
                  f"({100 * r['macs_vs_held_out']:+.1f}% MACs)", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"model": str(args.model), "test_images": len(y), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
