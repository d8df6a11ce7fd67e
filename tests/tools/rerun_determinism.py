"""Two runs of the whole pipeline from scratch, same commit, data and params: do they agree?

    python -m tests.tools.rerun_determinism                  # two fresh tiny-profile repos (about 12 min)
    python -m tests.tools.rerun_determinism --repos A B      # compare two repos that already ran `dvc repro`

Each fresh repo is a copy of this working tree on the tiny profile with a fourth module (the e2e
tests' cascade), run with `dvc repro` one after the other. The script compares the two `dvc.lock`
files output by output: metrics files (`metrics/`) may differ (they hold timings); any other output
that differs is a reproducibility bug, printed with both hashes, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from tests.tools.tiny_repo import add_fourth_module, make_tiny_repo, run_in

ALLOWED_PREFIXES = ("metrics/",)


def lock_outputs(lock: dict) -> dict[tuple[str, str], str]:
    """(stage, output path) -> content hash, for every output in a parsed dvc.lock."""
    return {(stage, out["path"]): str(out.get("md5") or out.get("hash") or "")
            for stage, entry in (lock.get("stages") or {}).items() for out in entry.get("outs") or []}


def compare_locks(a: dict, b: dict) -> dict[str, list]:
    """Outputs that are equal, that differ (split into allowed metrics files and the rest), and that
    exist in one lock only."""
    outs_a, outs_b = lock_outputs(a), lock_outputs(b)
    shared = sorted(set(outs_a) & set(outs_b))
    differ = [(k, outs_a[k], outs_b[k]) for k in shared if outs_a[k] != outs_b[k]]
    return {"equal": [k for k in shared if outs_a[k] == outs_b[k]],
            "metrics_differ": [d for d in differ if d[0][1].startswith(ALLOWED_PREFIXES)],
            "differ": [d for d in differ if not d[0][1].startswith(ALLOWED_PREFIXES)],
            "only_one": sorted(set(outs_a) ^ set(outs_b))}


def fresh_run(dest: Path) -> Path:
    repo = make_tiny_repo(dest)
    add_fourth_module(repo)
    run_in(repo, ["git", "commit", "-qam", "a fourth module"])
    started = time.perf_counter()
    run_in(repo, ["dvc", "repro"])
    print(f"dvc repro in {repo}: {time.perf_counter() - started:.0f} s", flush=True)
    return repo


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repos", nargs=2, type=Path, metavar=("A", "B"),
                   help="two repos that already ran `dvc repro` (default: make and run two fresh tiny ones)")
    p.add_argument("--workdir", type=Path, default=None, help="where fresh repos go (default: a temp folder)")
    args = p.parse_args(argv)
    if args.repos:
        repos = list(args.repos)
    else:
        work = args.workdir or Path(tempfile.mkdtemp(prefix="rerun-determinism-"))
        repos = [fresh_run(work / f"run{i}") for i in (1, 2)]
    a, b = (yaml.safe_load((r / "dvc.lock").read_text()) for r in repos)
    result = compare_locks(a, b)
    print(f"{len(result['equal'])} outputs identical; {len(result['metrics_differ'])} metrics files differ "
          f"(allowed: timings); {len(result['differ'])} other outputs differ; "
          f"{len(result['only_one'])} in one lock only")
    for (stage, path), _, _ in result["metrics_differ"]:
        print(f"  metrics  {stage}: {path}")
    for (stage, path), ha, hb in result["differ"]:
        print(f"  DIFFERS  {stage}: {path}  {ha} != {hb}")
    for stage, path in result["only_one"]:
        print(f"  ONE-SIDED {stage}: {path}")
    return 1 if result["differ"] or result["only_one"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
