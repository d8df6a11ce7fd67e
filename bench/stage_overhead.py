"""Benchmark: where a pipeline run's wall time goes, the stages' own work against what each stage
process and DVC cost around it, and what a stage process pays before its work starts.

    python -m bench.stage_overhead --runs KEPT_RUN [KEPT_RUN ...] [--repeats 5] [--out bench/out/stage_overhead.json]

A kept run is a repository a pipeline ran in (``python -m bench.own_data --keep DIR`` keeps one per folder
and seed). Its MLflow store holds one run per stage with start and end times: the time inside the stage
runs is the stages' work; the time between one run's end and the next one's start is the stage process
starting (Python, imports, opening the store) and ending, plus DVC hashing and locking between stages.
Only the latest pipeline execution of each store is read.

``--repeats`` fresh processes then time what every stage imports before its work: Python alone,
``import torch``, ``import mlflow``, and both with the SQLite store opened (medians). Results:
docs/RESULTS.md "Where the quick command's time goes".
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXECUTION_TAG = "pipeline_execution"  # pipeline.registry.tracking's tag: one value per `dvc repro`


def stage_runs(repo: Path) -> list[dict]:
    """The stage runs of the latest pipeline execution in ``repo``'s MLflow store, in start order:
    name, start and end (seconds since the epoch)."""
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    db = repo / "mlflow.db"
    if not db.is_file():
        raise SystemExit(f"{repo}: no mlflow.db (is it a kept run of bench.own_data?)")
    client = MlflowClient(tracking_uri=f"sqlite:///{db.resolve()}")
    ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    runs = [r for r in client.search_runs(ids, run_view_type=ViewType.ALL, max_results=5000)
            if r.info.end_time is not None]
    if not runs:
        raise SystemExit(f"{repo}: no finished stage runs in its MLflow store")
    latest = max(runs, key=lambda r: r.info.start_time).data.tags.get(EXECUTION_TAG)
    chosen = [r for r in runs if r.data.tags.get(EXECUTION_TAG) == latest]
    return [{"stage": r.info.run_name, "start": r.info.start_time / 1000, "end": r.info.end_time / 1000}
            for r in sorted(chosen, key=lambda r: r.info.start_time)]


def split(runs: list[dict]) -> dict:
    """First start to last end, split into time inside the stage runs and time between them."""
    inside = {r["stage"]: round(r["end"] - r["start"], 2) for r in runs}
    span = runs[-1]["end"] - runs[0]["start"]
    work = sum(r["end"] - r["start"] for r in runs)
    gaps = [b["start"] - a["end"] for a, b in zip(runs[:-1], runs[1:], strict=True)]
    return {"stages": len(runs), "span_s": round(span, 1), "inside_stages_s": round(work, 1),
            "between_stages_s": round(span - work, 1),
            "gap_median_s": round(statistics.median(gaps), 2) if gaps else 0.0, "per_stage_s": inside}


def process_seconds(code: str, repeats: int) -> float:
    """Median wall seconds of a fresh ``python -c code``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 2)


def import_costs(repeats: int) -> dict:
    """What a stage process pays before its work: medians of fresh processes."""
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        open_store = (f"from mlflow import MlflowClient; c = MlflowClient(tracking_uri={uri!r}, registry_uri={uri!r}); "
                      "c.search_experiments(max_results=1); c.search_registered_models(max_results=1)")
        subprocess.run([sys.executable, "-c", open_store], check=True, capture_output=True)  # creates the schema
        codes = {"python": "pass", "import torch": "import torch", "import mlflow": "import mlflow",
                 "torch + mlflow + the SQLite store": "import torch; " + open_store}
        return {name: process_seconds(code, repeats) for name, code in codes.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=Path, nargs="+", required=True, metavar="KEPT_RUN")
    p.add_argument("--repeats", type=int, default=5, help="fresh processes per import measurement (0: none)")
    p.add_argument("--out", type=Path, default=Path("bench/out/stage_overhead.json"))
    args = p.parse_args(argv)
    rows = []
    for repo in args.runs:
        row = {"run": str(repo), **split(stage_runs(repo))}
        rows.append(row)
        print(f"{repo}: {row['stages']} stages in {row['span_s']:.0f} s: inside the stage runs "
              f"{row['inside_stages_s']:.0f} s, between them {row['between_stages_s']:.0f} s "
              f"(median gap {row['gap_median_s']:.1f} s)", flush=True)
    imports = import_costs(args.repeats) if args.repeats > 0 else {}
    for name, seconds in imports.items():
        print(f"fresh process, {name}: {seconds:.2f} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": rows, "process_seconds": imports, "repeats": args.repeats},
                                   indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
