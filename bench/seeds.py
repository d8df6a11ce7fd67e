"""Headline figures over several seeds of the default pipeline: mean and spread (max - min).

    python -m bench.seeds --run --seeds 0 1 2     # one `dvc exp run -S seed=N` per seed, then the summary
    python -m bench.seeds                          # the summary of the seeds already recorded

Each seed is a DVC experiment (`dvc exp run -S seed=N --name seed-N-<time>`, so `dvc exp show` lists them)
run in the workspace one after another; after each, its `metrics/evaluate.json` is copied to
`docs/results/seeds/seed_N.json` and its budget curves to `budget_curve_seed_N.csv` beside it. The
seed changes everything downstream of it: the stratified
splits, the grading folds, every module's initial weights, data order and architecture draws, the
baselines. When the runs are done the workspace goes back to the committed params and outputs
(`git checkout params.yaml dvc.lock metrics && dvc checkout`). The summary prints, per figure, each
seed's value, the mean and the spread, and which of the cascade's targets (docs/RESULTS.md "The cascade on
the test split") every seed meets.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

FIGURES = {
    "cascade accuracy": lambda m: m["cascade"]["accuracy"],
    "cascade mean MACs": lambda m: m["cascade"]["mean_macs"],
    "exit 1 accuracy": lambda m: m["each_exit"][0]["accuracy"],
    "last exit accuracy": lambda m: m["each_exit"][-1]["accuracy"],
    "fixed cascade accuracy": lambda m: m["baselines"]["fixed_cascade"]["accuracy"],
    "fixed cascade mean MACs": lambda m: m["baselines"]["fixed_cascade"]["mean_macs"],
    "fixed at equal MACs accuracy":
        lambda m: m["baselines"].get("fixed_cascade_at_cascade_macs", {}).get("accuracy", float("nan")),
    "two-CNN cascade accuracy": lambda m: m["baselines"]["two_cnn_cascade"]["accuracy"],
    "two-CNN cascade mean MACs": lambda m: m["baselines"]["two_cnn_cascade"]["mean_macs"],
    "plain large CNN accuracy": lambda m: m["baselines"]["plain_large"]["accuracy"],
    "worst routing candidate accuracy":  # as a standalone exit on test (nan: no module has several)
        lambda m: min((r["accuracy"] for r in m.get("candidate_exits", [])), default=float("nan")),
}


def run_seed(seed: int, out_dir: Path, force: bool = False) -> Path:
    """One default pipeline run with ``seed`` as a DVC experiment; its evaluate metrics copied out.

    Without ``force``, DVC's run cache restores any stage whose code, deps and params it has already
    run (for example the baselines of a seed run before, when only module settings changed)."""
    # DVC refuses a name already used on this commit (after the run); the time stamp keeps reruns apart.
    name = f"seed-{seed}-{time.strftime('%m%d-%H%M')}"
    cmd = ["dvc", "exp", "run", "-S", f"seed={seed}", "--name", name] + (["--force"] if force else [])
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"seed_{seed}.json"
    shutil.copyfile("metrics/evaluate.json", target)
    shutil.copyfile("plots/evaluate/budget_curve.csv", out_dir / f"budget_curve_seed_{seed}.csv")
    return target


def restore_workspace() -> None:
    subprocess.run(["git", "checkout", "--", "params.yaml", "dvc.lock", "metrics"], check=True)
    subprocess.run(["dvc", "checkout", "--force"], check=True)


def summarise(files: list[Path]) -> dict:
    runs = {int(f.stem.removeprefix("seed_")): json.loads(f.read_text()) for f in files}
    seeds = sorted(runs)
    table = {}
    for name, get in FIGURES.items():
        values = [float(get(runs[s])) for s in seeds]
        table[name] = {"values": dict(zip(seeds, values, strict=True)), "mean": statistics.fmean(values),
                       "spread": max(values) - min(values)}
    targets = {}
    for s in seeds:
        for name, check in runs[s].get("targets", {}).items():
            targets.setdefault(name, {})[s] = bool(check["met"])
    return {"seeds": seeds, "figures": table, "targets": targets}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--run", action="store_true", help="run the pipeline for each seed first (long)")
    p.add_argument("--out", type=Path, default=Path("docs/results/seeds"))
    p.add_argument("--force", action="store_true",
                   help="re-run every stage of each seed (no run-cache restores): what the repro time measures")
    args = p.parse_args(argv)
    if args.run:
        try:
            for seed in args.seeds:
                run_seed(seed, args.out, force=args.force)
        finally:
            restore_workspace()
    files = [args.out / f"seed_{s}.json" for s in args.seeds if (args.out / f"seed_{s}.json").exists()]
    if not files:
        print(f"no seed results in {args.out}; run with --run", file=sys.stderr)
        return 1
    summary = summarise(files)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    seeds = summary["seeds"]
    print(f"{'figure':28s} " + " ".join(f"{'seed ' + str(s):>12s}" for s in seeds) + f" {'mean':>12s} {'spread':>10s}")
    for name, row in summary["figures"].items():
        scale, fmt = (100.0, "{:11.2f}%") if "accuracy" in name else (1e-6, "{:11.3f}M")
        cells = " ".join(fmt.format(scale * v) for v in row["values"].values())
        print(f"{name:28s} {cells} {fmt.format(scale * row['mean'])} {scale * row['spread']:10.3f}")
    for name, met in summary["targets"].items():
        print(f"target {name}: " + ", ".join(f"seed {s} {'met' if ok else 'MISSED'}" for s, ok in met.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
