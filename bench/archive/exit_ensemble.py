"""The exit ensemble, decay by decay, on a trained cascade: thresholds fitted on the held-out set (`route`
+ `calib` unless `calibrate.held_out` says `calib`) as the
`calibrate` stage fits them (params' `calibrate` section), then the same thresholds on `test`.

    python -m bench.archive.exit_ensemble                      # models/cascade, data/prepared, params.yaml
    python -m bench.archive.exit_ensemble --decays 0 0.25 0.5 0.75 1

`calibrate` keeps the decay best on calib; the test columns are shown for information only (choosing
by them would be fitting to the test split). Writes bench/out/exit_ensemble.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from pipeline.io import load_held_out, load_split, write_json
from pipeline.models.modules import confidence
from pipeline.params.config import CalibrateConfig, load_params
from pipeline.routing.calibration import simulate_thresholds
from pipeline.routing.engine import combine_exits
from pipeline.routing.fit import exit_outputs, fit
from pipeline.routing.package import load_cascade
from pipeline.routing.recognize import preprocess


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=Path("models/cascade"))
    p.add_argument("--data", type=Path, default=Path("data/prepared"))
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--decays", type=float, nargs="+", default=None, help="default: calibrate.ensemble_decays")
    p.add_argument("--out", type=Path, default=Path("bench/out/exit_ensemble.json"))
    args = p.parse_args(argv)
    cfg = CalibrateConfig.from_params(load_params(args.params))
    decays = args.decays or cfg.ensemble_decays
    model = load_cascade(args.model)
    kind = model.meta.confidence_kind
    torch.set_grad_enabled(False)
    outputs = {}
    for split in ("calib", "test"):  # "calib": the held-out set calibrate fits on (calibrate.held_out)
        held = cfg.held_out
        data = load_held_out(args.data, held) if split == "calib" else load_split(args.data, split)
        logits, cum = exit_outputs(model.stages, preprocess(data.images, model.meta), kind)
        outputs[split] = (logits, cum, torch.from_numpy(data.labels))
    rows = []
    print(f"{'decay':>6} | {'calib exits':>22} | {'calib cascade':>18} | {'test exits':>22} | {'test cascade':>18}")
    for decay in decays:
        res = fit(*outputs["calib"], cfg, kind, decay)
        logits, cum, y = outputs["test"]
        scores = combine_exits(logits, decay)
        correct = (scores.argmax(dim=-1) == y[:, None]).numpy()
        acc, macs, counts = simulate_thresholds(confidence(scores, kind).numpy(), correct, cum, res["thresholds"])
        row = {"decay": decay, "thresholds": res["thresholds"],
               "calib": {"exit_accuracy": res["exit_accuracy"], "accuracy": res["accuracy"],
                         "mean_macs": res["mean_macs"]},
               "test": {"exit_accuracy": correct.mean(axis=0).tolist(), "accuracy": acc, "mean_macs": macs,
                        "exit_counts": np.asarray(counts).tolist()}}
        rows.append(row)
        pct = lambda xs: " / ".join(f"{100 * v:.2f}" for v in xs)  # noqa: E731
        print(f"{decay:>6g} | {pct(res['exit_accuracy']):>22} | {100 * res['accuracy']:6.2f}% at "
              f"{res['mean_macs'] / 1e6:.2f} M"
              f" | {pct(row['test']['exit_accuracy']):>22} | {100 * acc:6.2f}% at {macs / 1e6:.2f} M")
    write_json(args.out, {"model": str(args.model), "calibrate": cfg.section(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
