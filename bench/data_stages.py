"""Benchmark: wall time and peak memory of ingest + validate + grade on the configured dataset
(default: full Fashion-MNIST), each stage a fresh process writing to a scratch directory, and the
time of a no-op `dvc repro` in this workspace when it is up to date.

    python -m bench.data_stages [--params params.yaml] [--out bench/out/data_stages.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_measured(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run a command; return (wall seconds, peak resident memory in MiB) of that process alone."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out", type=Path, default=Path("bench/out/data_stages.json"))
    args = p.parse_args(argv)
    env = dict(os.environ)
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        t = Path(tmp)
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{t / 'mlflow.db'}"
        stages = {
            "ingest": [py, "-m", "stages.ingest", "--params", args.params, "--out", str(t / "prepared"),
                       "--metrics", str(t / "ingest.json")],
            "validate": [py, "-m", "stages.validate", "--params", args.params, "--data", str(t / "prepared"),
                         "--out", str(t / "validation")],
            "grade": [py, "-m", "stages.grade", "--params", args.params, "--data", str(t / "prepared"),
                      "--validation", str(t / "validation" / "summary.json"), "--out", str(t / "graded"),
                      "--metrics", str(t / "grade.json"), "--plots", str(t / "plots")],
        }
        # The first MLflow run creates the SQLite schema; do that outside the timed stages, as in a repo
        # where mlflow.db exists already.
        subprocess.run([py, "-c", "import mlflow; mlflow.set_tracking_uri(" + repr(env["MLFLOW_TRACKING_URI"])
                        + "); mlflow.search_experiments()"], env=env, check=True, capture_output=True)
        rows = {}
        for name, cmd in stages.items():
            wall, peak = run_measured(cmd, env)
            rows[name] = {"seconds": round(wall, 2), "peak_mib": round(peak, 1)}
            print(f"{name:9s} {wall:7.2f} s  peak {peak:7.1f} MiB", flush=True)
    total = sum(r["seconds"] for r in rows.values())
    print(f"{'total':9s} {total:7.2f} s  (target <= 60 s)")
    result = {"stages": rows, "total_seconds": round(total, 2)}
    status = subprocess.run(["dvc", "status", "--quiet"], capture_output=True)
    if status.returncode == 0:
        started = time.perf_counter()
        subprocess.run(["dvc", "repro"], check=True, capture_output=True)
        result["noop_repro_seconds"] = round(time.perf_counter() - started, 2)
        print(f"no-op dvc repro {result['noop_repro_seconds']:.2f} s  (target <= 5 s)")
    else:
        print("no-op dvc repro: skipped (workspace not up to date; run `make repro` first)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
