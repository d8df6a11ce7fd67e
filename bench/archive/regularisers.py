"""Training regularisers on one module, in the real train stage, side by side in one run.

    dvc repro train@m2                                   # the pipeline's modules 1 and 2
    python -m bench.archive.regularisers                         # module 2: control, erase 0.5, smoothing 0.1
    python -m bench.archive.regularisers --module 2 --variant erase25=erase:0.25 --variant ls05=label_smoothing:0.05
    python -m bench.archive.regularisers --module 2 --variant kd1=kd:1.0,kd_temperature:2 \
        --out docs/results/distill_m2.json

Each variant re-runs ``python -m stages.train`` for module K behind the pipeline's frozen modules
1..K-1 (``--models``, linked, never written), with the params' ``modules.mK.train`` plus the
variant's overrides, into its own folder under ``--work``; a ``control`` variant (no override) is
always trained too, so every row comes from the same code and machine. ``--jobs`` variants train at
once, one thread each (2 on the 2-core machine: the same total throughput as one at a time with two
threads). Each trained module is then scored on ``calib`` and ``test``: exit K alone and in the exit
ensemble with the frozen exits before it (decays 0.25 and 0.5, as ``calibrate.ensemble_decays``).
MLflow runs and resumable checkpoints go under ``--work``, not the project's. Modules with ``kd`` > 0
(params or variant) learn from the ``--teacher`` baselines directory's plain_large (``dvc repro
baselines``). The result goes to ``docs/results/regularisers_mK.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from bench.report import report_parts
from pipeline.io import load_split
from pipeline.models.modules import NO_ARCH
from pipeline.models.profile import LATENCY_FILE
from pipeline.models.store import load_module
from pipeline.params.config import load_params
from pipeline.routing.engine import combine_exits

DEFAULT_VARIANTS = ("erase50=erase:0.5", "ls10=label_smoothing:0.1")
DECAYS = (0.25, 0.5)


def parse_variant(text: str) -> tuple[str, dict]:
    """``name=key:value,key:value`` -> (name, {key: value}); values read as YAML scalars."""
    name, _, body = text.partition("=")
    if not name or not body:
        raise argparse.ArgumentTypeError(f"a variant is name=key:value[,key:value], got {text!r}")
    overrides = {}
    for item in body.split(","):
        key, sep, value = item.partition(":")
        if not sep:
            raise argparse.ArgumentTypeError(f"variant {name}: {item!r} is not key:value")
        overrides[key.strip()] = yaml.safe_load(value)
    return name, overrides


def variant_params(params: dict, k: int, overrides: dict) -> dict:
    """The params with ``overrides`` laid over ``modules.mK.train``."""
    out = json.loads(json.dumps(params))
    module = out["modules"][f"m{k}"]
    module["train"] = {**(module.get("train") or {}), **overrides}
    return out


def start_training(root: Path, work: Path, models: Path, k: int, params: dict,
                   teacher: Path | None = None) -> subprocess.Popen:
    """One train stage run for module K into ``work`` (frozen modules linked from ``models``)."""
    modules = work / "models" / "modules"
    modules.mkdir(parents=True, exist_ok=True)
    for j in range(1, k):
        link = modules / f"m{j}"
        if not link.exists():
            link.symlink_to((models / f"m{j}").resolve())
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{(work / 'mlflow.db').resolve()}"}
    # --root is the variant's folder: its resumable checkpoints (.cache/train) stay apart from the
    # project's and from the other variants' (the stage clears checkpoints of other inputs at start)
    cmd = [sys.executable, "-m", "stages.train", "--params", str(work / "params.yaml"), "--root", str(work),
           "--latency", str(root / LATENCY_FILE),
           "--module", str(k), "--data", str(root / "data/prepared"), "--graded", str(root / "data/graded"),
           "--profile", str(root / "models/profile.json"), "--models", str(modules),
           "--metrics", str(work / "metrics.json")] + (["--teacher", str(teacher)] if teacher is not None else [])
    log = (work / "train.log").open("w")
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)


def exit_scores(modules_dir: Path, k: int, data: Path, split: str) -> dict[str, float]:
    """Test-style accuracy (%) of exit K alone and in the exit ensemble with exits 1..K-1 (fixed
    modules on their only path, supernets on the path their select stage chose)."""
    modules = [load_module(modules_dir / f"m{j}" / "train") for j in range(1, k + 1)]
    info = modules[0][1]
    s = load_split(data, split)
    x = torch.from_numpy(s.images).float().div_(255.0)
    x = (x - torch.tensor(info.mean).view(1, -1, 1, 1)) / torch.tensor(info.std).view(1, -1, 1, 1)
    y = torch.as_tensor(np.asarray(s.labels, dtype=np.int64))
    logits = []
    with torch.no_grad():
        h = x
        for j, (module, _) in enumerate(modules, start=1):
            arch = NO_ARCH
            selection = modules_dir / f"m{j}" / "select" / "selection.json"
            if j < k and selection.exists():
                raise ValueError(f"m{j} has a selection (a supernet in the prefix): not supported here")
            parts = [module(h[i:i + 1000], arch) for i in range(0, len(h), 1000)]
            h = torch.cat([p[0] for p in parts])
            logits.append(torch.cat([p[1] for p in parts]))
    stacked = torch.stack(logits, dim=1)  # (N, K, classes)
    row = {"alone": 100 * float((stacked[:, -1].argmax(-1) == y).double().mean())}
    for decay in DECAYS:
        scores = combine_exits(stacked, decay)[:, -1]
        row[f"ensemble {decay}"] = 100 * float((scores.argmax(-1) == y).double().mean())
    return {key: round(value, 2) for key, value in row.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--module", type=int, default=2, help="module K to retrain (its prefix must be fixed modules)")
    p.add_argument("--variant", type=parse_variant, action="append", default=None,
                   help=f"name=key:value[,key:value] over modules.mK.train (default: {' '.join(DEFAULT_VARIANTS)})")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--models", type=Path, default=Path("models/modules"), help="the pipeline's trained modules")
    p.add_argument("--work", type=Path, default=Path(".cache/bench_regularisers"))
    p.add_argument("--teacher", type=Path, default=Path("models/baselines"),
                   help="baselines directory: plain_large teaches modules and variants with kd > 0")
    p.add_argument("--jobs", type=int, default=2, help="variants trained at once (one thread each)")
    p.add_argument("--out", type=Path, default=Path("docs/results/regularisers.json"))
    args = p.parse_args(argv)
    root, k = Path.cwd(), args.module
    params = load_params(args.params)
    variants = [("control", {})] + (args.variant or [parse_variant(v) for v in DEFAULT_VARIANTS])
    pending, running, done = list(variants), [], []
    while pending or running:
        while pending and len(running) < args.jobs:
            name, overrides = pending.pop(0)
            work = args.work / name
            print(f"train m{k} {name} {overrides or '(params as they are)'} -> {work}", flush=True)
            running.append((name, overrides, work, time.perf_counter(),
                            start_training(root, work, args.models, k, variant_params(params, k, overrides),
                                           args.teacher if args.teacher.is_dir() else None)))
        time.sleep(2)
        for item in [r for r in running if r[-1].poll() is not None]:
            running.remove(item)
            name, overrides, work, start, proc = item
            if proc.returncode != 0:
                raise SystemExit(f"variant {name} failed (exit {proc.returncode}); see {work / 'train.log'}")
            row = {"variant": name, "overrides": overrides, "seconds (one thread)": round(time.perf_counter() - start)}
            for split in ("calib", "test"):
                row.update({f"{split} {key}": v for key, v in
                            exit_scores(work / "models" / "modules", k, root / "data/prepared", split).items()})
            done.append(row)
            print(json.dumps(row), flush=True)
    order = [name for name, _ in variants]
    rows = sorted(done, key=lambda r: order.index(r["variant"]))
    out = {"settings": {"module": k, "epochs": variant_params(params, k, {})["modules"][f"m{k}"]["train"].get(
        "epochs"), "models": str(args.models)}, f"m{k}": rows}
    target = report_parts(out, [f"m{k}"], args.out, f"m{k}")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
