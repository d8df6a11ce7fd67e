"""The user's kind of data, measured: each folder of ``bench.own_data_folders`` through the user's
command (``python -m pipeline.profiles --profile quick --data imagefolder:<folder>``, what ``make repro
PROFILE=quick DATA=...`` runs) on a copy of this working tree, for several seeds; per folder and seed
the shipped model, the calibrated cascade, each exit alone and the plain baselines, with test accuracy,
its standard error, mean MACs and the pipeline's wall time.

    python -m bench.own_data                                   # 5 folders x seeds 0 1 2 (over an hour here)
    python -m bench.own_data --folders shop-colour-48 --seeds 0
    python -m bench.own_data --report bench/out/own_data.json  # the tables of an earlier run
    python -m bench.own_data --rejudge KEPT/scenes-colour-64-seed0 ...  # kept runs' ship decision re-made
    python -m bench.own_data --anchors resnet18@8 shufflenet_v2@0.5     # the field's nets beside each run

Targets it checks (docs/RESULTS.md 'Your own images'): on every folder and seed the shipped model is
dominated by none of the others (another at <= its MACs more than one standard error better on test)
and reads within 0.3 points + 1 SE of the best single exit; over the folders its mean accuracy is >= plain_large's - 0.3
points at <= 0.5x its mean MACs. Writes bench/out/own_data.json (every run is saved as it finishes).
Run it alone: wall times are read on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.own_data_folders import FOLDERS, make_folder
from pipeline.evaluation.dominance import dominance

ROOT = Path(__file__).resolve().parents[1]


def working_copy(dest: Path) -> Path:
    """The working tree's files (tracked and untracked, not ignored) in a fresh git repo at ``dest``,
    with this checkout's .venv linked in."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for rel in (line for line in out.splitlines() if line and (ROOT / line).is_file()):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    for cmd in (
        ["git", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "-c", "user.email=b@example.com", "-c", "user.name=bench", "commit", "-qm", "copy"],
    ):
        subprocess.run(cmd, cwd=dest, check=True, capture_output=True)
    return dest


def env_for(repo: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{repo / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
        "MLFLOW_ENABLE_TELEMETRY": "false",
        "GX_ANALYTICS_ENABLED": "false",
        "MLFLOW_TRACKING_URI": f"sqlite:///{repo / 'mlflow.db'}",
        "PYTHONPATH": str(repo),
    }


def dominated_cell(run: dict[str, Any]) -> str:
    """The table's "dominated by" cell: the dominating models, else those nearly so (``near: ...``)."""
    if run["dominated_by"]:
        return ", ".join(run["dominated_by"])
    near = run.get("nearly_dominated_by") or []  # absent in results written before it existed
    return f"near: {', '.join(near)}" if near else "-"


def rows_of(evaluation: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Every model a run can ship, as name -> {accuracy, mean_macs}, read from metrics/evaluate.json."""
    rows = {"cascade": evaluation["cascade"]}
    for row in evaluation["each_exit_alone"]:
        rows[f"exit {row['exit']}"] = row
    for name in ("plain_small", "plain_large", "two_cnn_cascade"):
        rows[name] = evaluation["baselines"][name]
    return {
        k: {"accuracy": float(v["accuracy"]), "mean_macs": float(v["mean_macs"])} for k, v in rows.items()
    }


def judge(evaluation: dict[str, Any]) -> dict[str, Any]:
    """The issue's checks on one run, read on test by the pipeline's own rule (pipeline.evaluation.dominance): who
    dominates the shipped model (the cascade, or the plain CNN calibrate chose on held-out images), and
    whether it reads within 0.3 points + 1 SE of the cascade's best exit."""
    n = int(sum(map(sum, evaluation["cascade"]["confusion"])))
    shipped = (evaluation.get("shipped") or {}).get("model", "cascade")  # runs before issue 37: the cascade
    verdict = dominance(evaluation, n, shipped)
    return {
        "test_images": n,
        "shipped": shipped,
        "accuracy": verdict["accuracy"],
        "mean_macs": verdict["mean_macs"],
        "se": verdict["se"],
        "dominated_by": verdict["dominated_by"],
        "nearly_dominated_by": verdict["nearly_dominated_by"],
        "best_exit_accuracy": verdict["best_exit_accuracy"],
        "within_best_exit": verdict["within_best_exit"],
        "rows": rows_of(evaluation),
    }


def anchors_beside(repo: Path, anchors: tuple[str, ...], seed: int, shipped: dict[str, Any]) -> dict[str, Any]:
    """The field's nets (``bench.anchors``) trained on this run's train split at plain_large's step budget,
    read on its test split; those at <= the shipped model's MACs reading more than its SE higher."""
    from bench.anchors import parse_anchor, train_and_read

    rows = [train_and_read(repo, *parse_anchor(a), seed) for a in anchors]
    ahead = [r["name"] for r in rows
             if r["mean_macs"] <= shipped["mean_macs"] and r["accuracy"] > shipped["accuracy"] + shipped["se"]]
    return {"anchors": rows, "dominated_by_anchors": ahead}


def held_out_figures(repo: Path) -> dict[str, Any]:
    """The figures a choice between settings may read: accuracies on the held-out images (route +
    calib) that calibrate and baselines fit on, never on test."""
    cal = json.loads((repo / "metrics" / "calibrate.json").read_text())["selected"]
    base = json.loads((repo / "metrics" / "baselines.json").read_text())
    return {
        "cascade": cal["accuracy"],
        "cascade_mean_macs": cal["mean_macs"],
        "exits": cal["exit_accuracy"],
        **{name: base[name]["calib_accuracy"] for name in ("plain_small", "plain_large", "two_cnn_cascade")},
        "images": base.get("calib_images"),
    }


DECIDING_STAGES = ("calibrate", "evaluate", "register")  # what ships, its verdict and its registration


def rejudge(repo: Path, logs: Path) -> dict[str, Any]:
    """A kept run (``--keep``) decided again with this checkout's code: its pipeline/ and stages/ replace
    the run's, then dvc.yaml's own calibrate, evaluate and register commands run there (the trained
    models, the splits and the baselines stay as they are). For a change to what ships or how it is
    judged, without training again."""
    import shlex

    import yaml

    for part in ("pipeline", "stages"):
        shutil.rmtree(repo / part)
        shutil.copytree(ROOT / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    started = time.perf_counter()
    log = logs / f"{repo.name}-rejudge.log"
    with open(log, "w") as fh:
        for name in DECIDING_STAGES:
            if subprocess.call(shlex.split(stages[name]["cmd"]), cwd=repo, env=env_for(repo), stdout=fh,
                               stderr=subprocess.STDOUT) != 0:
                return {"repo": repo.name, "failed": f"{name}: see {log}"}
    folder, _, seed = repo.name.rpartition("-seed")
    evaluation = json.loads((repo / "metrics" / "evaluate.json").read_text())
    choice = json.loads((repo / "metrics" / "calibrate.json").read_text()).get("shipped", {})
    meta = json.loads((repo / "data" / "prepared" / "meta.json").read_text())
    return {"folder": folder, "seed": int(seed), "image_shape": meta.get("image_shape"),
            "held_out": held_out_figures(repo), "shipped_choice": choice.get("reason"), **judge(evaluation),
            "rejudge_s": round(time.perf_counter() - started, 1)}


def run_one(
    folder: Path,
    seed: int,
    profile: str,
    logs: Path,
    keep: Path | None = None,
    overrides: tuple[str, ...] = (),
    anchors: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One pipeline run in a fresh copy of the working tree (kept under ``keep`` when given, for a look at
    its models and splits afterwards; else removed)."""
    with tempfile.TemporaryDirectory(prefix="cascade-own-data-") as tmp:
        where = keep / f"{folder.name}-seed{seed}" if keep else Path(tmp) / "repo"
        if where.exists():
            shutil.rmtree(where)
        where.parent.mkdir(parents=True, exist_ok=True)
        repo = working_copy(where)
        log = logs / f"{folder.name}-seed{seed}.log"
        started = time.perf_counter()
        with open(log, "w") as fh:
            status = subprocess.call(
                [
                    sys.executable,
                    "-m",
                    "pipeline.profiles",
                    "--profile",
                    profile,
                    "--data",
                    f"imagefolder:{folder.resolve()}",
                    "--",
                    "-S",
                    f"seed={seed}",
                    *(a for o in overrides for a in ("-S", o)),
                ],
                cwd=repo,
                env=env_for(repo),
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        seconds = time.perf_counter() - started
        if status != 0:
            return {"folder": folder.name, "seed": seed, "failed": f"exit {status}, log {log}"}
        evaluation = json.loads((repo / "metrics" / "evaluate.json").read_text())
        meta = json.loads((repo / "data" / "prepared" / "meta.json").read_text())
        ingest = json.loads((repo / "metrics" / "ingest.json").read_text())
        held_out = held_out_figures(repo)
        verdict = judge(evaluation)
        beside = anchors_beside(repo, anchors, seed, verdict) if anchors else {}
    return {
        "folder": folder.name,
        "seed": seed,
        "pipeline_s": round(seconds, 1),
        "overrides": list(overrides),
        "input": ingest.get("input", {}),
        "image_shape": meta.get("image_shape"),
        "held_out": held_out,
        "splits": {k: v for k, v in ingest.items() if k.endswith("_count")},
        **verdict,
        **beside,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "failed" not in r]
    if not ok:
        return {}
    shipped = sum(r["accuracy"] for r in ok) / len(ok)
    large = [r["rows"]["plain_large"] for r in ok]
    return {
        "runs": len(ok),
        "failed": len(runs) - len(ok),
        "never_dominated": all(not r["dominated_by"] for r in ok),
        "never_dominated_by_anchors": all(not r.get("dominated_by_anchors") for r in ok),
        "within_best_exit": all(r["within_best_exit"] for r in ok),
        "mean_accuracy": shipped,
        "mean_plain_large_accuracy": sum(x["accuracy"] for x in large) / len(ok),
        "mean_macs_share_of_plain_large": sum(
            r["mean_macs"] / x["mean_macs"] for r, x in zip(ok, large, strict=True)
        )
        / len(ok),
    }


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| folder | seed | input | shipped | acc (SE) | MACs | cascade | best exit | plain_small "
        "| plain_large | two_cnn | dominated by | minutes |",
        "|" + " --- |" * 13,
    ]

    def cell(row: dict[str, float]) -> str:
        return f"{100 * row['accuracy']:.2f}% @ {row['mean_macs'] / 1e6:.2f} M"

    for r in runs:
        if "failed" in r:
            lines.append(f"| {r['folder']} | {r['seed']} | failed: {r['failed']} |" + " |" * 10)
            continue
        rows = r["rows"]
        best = max((v for k, v in rows.items() if k.startswith("exit ")), key=lambda v: v["accuracy"])
        shape = "x".join(map(str, r.get("image_shape") or r["input"].get("shape", []))) or "?"
        lines.append(
            f"| {r['folder']} | {r['seed']} | {shape} | {r['shipped']} | {100 * r['accuracy']:.2f}% "
            f"({100 * r['se']:.2f}) | {r['mean_macs'] / 1e6:.2f} M | {cell(rows['cascade'])} | {cell(best)} "
            f"| {cell(rows['plain_small'])} | {cell(rows['plain_large'])} | {cell(rows['two_cnn_cascade'])} "
            f"| {dominated_cell(r)} | {r.get('pipeline_s', r.get('rejudge_s', 0)) / 60:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--folders", nargs="*", default=list(FOLDERS), help="default: all")
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    p.add_argument("--profile", default="quick")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=ROOT / "bench" / "out" / "own_data_folders",
        help="where the folders are built (kept between runs)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "own_data.json")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a params override for every run (dvc exp run -S), e.g. modules.m2.train.kd=1.0",
    )
    p.add_argument("--anchors", nargs="*", default=[], metavar="ARCH@WIDTH",
                   help="the field's nets (bench.anchors) to train beside each run, e.g. resnet18@8")
    p.add_argument("--keep", type=Path, default=None, help="keep each run's repository under this folder")
    p.add_argument("--report", type=Path, default=None, help="print the tables of an earlier run and stop")
    p.add_argument("--rejudge", type=Path, nargs="+", default=None, metavar="KEPT_RUN",
                   help="runs kept by --keep (FOLDER-seedN): re-run their calibrate, evaluate and register with "
                        "this checkout's code (no training) and write --out")
    args = p.parse_args(argv)
    if args.report:
        runs = json.loads(args.report.read_text())["runs"]
        print(table(runs))
        print(json.dumps(summary(runs), indent=2))
        return 0
    logs = args.out.parent / "own_data_logs"
    logs.mkdir(parents=True, exist_ok=True)
    if args.rejudge:
        runs = [rejudge(repo.resolve(), logs) for repo in args.rejudge]
        args.out.write_text(json.dumps({"profile": args.profile, "rejudged": True, "runs": runs,
                                        "summary": summary(runs)}, indent=2) + "\n")
        print(table([r for r in runs if "failed" not in r]))
        print(json.dumps(summary(runs), indent=2))
        return 0
    runs: list[dict[str, Any]] = []
    for name in args.folders:
        folder = make_folder(name, args.data_dir)
        for seed in args.seeds:
            print(f"own_data: {name} seed {seed} ...", flush=True)
            runs.append(run_one(folder, seed, args.profile, logs, args.keep, tuple(args.set), tuple(args.anchors)))
            args.out.write_text(
                json.dumps({"profile": args.profile, "runs": runs, "summary": summary(runs)}, indent=2) + "\n"
            )
            print(table(runs[-1:]).splitlines()[-1], flush=True)
    print(table(runs))
    print(json.dumps(summary(runs), indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
