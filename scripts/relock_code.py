"""Re-record dvc.lock's hashes of the files that are present, keeping the recorded hashes of missing ones.

For a code change that does not change what any stage computes (a refactor, a new option that is off, a
rule that only applies to inputs the committed run does not have), in a checkout without the pipeline's
outputs (a clean clone): code and params entries get their new hashes, while outputs and data
dependencies that are absent keep the hashes the last real run recorded. `dvc commit -f` cannot do this
without the outputs (it hashes every output, and its run cache needs the data).

    python scripts/relock_code.py            # rewrite dvc.lock, print the entries that changed

It is not a way to skip a run: a change that moves an output needs `dvc repro` of the stages it touches.
"""

from __future__ import annotations

import argparse
import sys
from itertools import groupby
from pathlib import Path

import yaml
from dvc.repo import Repo


def _entries(lock: dict) -> dict[tuple[str, str, str], str]:
    """(stage, deps|outs, path) -> md5 of a dvc.lock mapping."""
    return {(stage, kind, entry["path"]): entry.get("md5", "")
            for stage, body in lock.get("stages", {}).items()
            for kind in ("deps", "outs") for entry in body.get(kind, [])}


def _produced(lock: dict) -> dict[str, dict]:
    """Output path -> its dvc.lock entry (what the last run of the producing stage wrote)."""
    return {entry["path"]: entry for body in lock.get("stages", {}).values() for entry in body.get("outs", [])}


def _fill_new_deps(stage, produced: dict[str, dict]) -> None:
    """A dependency new to ``stage`` and absent here gets the hash its producing stage's output has in the
    lock: what that stage's last run wrote, so what this stage would have read."""
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.meta import Meta

    for dep in stage.deps:
        entry = produced.get(dep.def_path)
        if entry is not None and not dep.hash_info and not dep.exists:
            dep.hash_name = "md5"  # the name DVC 3 records as `hash: md5`
            dep.hash_info = HashInfo("md5", entry["md5"])
            dep.meta = Meta(size=entry.get("size"), nfiles=entry.get("nfiles"), isdir=entry["md5"].endswith(".dir"))


def relock(root: Path) -> list[tuple[str, str, str]]:
    """Rewrite ``root/dvc.lock``; the (stage, kind, path) entries whose hash changed."""
    before = _entries(yaml.safe_load((root / "dvc.lock").read_text()))
    repo = Repo(str(root))
    produced = _produced(yaml.safe_load((root / "dvc.lock").read_text()))
    with repo.lock:
        infos = list(repo.stage.collect_granular(None))
        for dvcfile, group in groupby(infos, key=lambda info: info.stage.dvcfile):
            stages = [info.stage for info in group]
            for stage in stages:
                stage.save(allow_missing=True, run_cache=False)
                _fill_new_deps(stage, produced)
            dvcfile.dump_stages(stages, update_pipeline=False)
    after = _entries(yaml.safe_load((root / "dvc.lock").read_text()))
    return sorted(key for key in after if before.get(key) != after[key])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path("."), help="the repository (default: here)")
    args = p.parse_args(argv)
    if not (args.root / "dvc.lock").is_file():
        print(f"relock_code: no dvc.lock in {args.root.resolve()}", file=sys.stderr)
        return 2
    changed = relock(args.root)
    outs = [key for key in changed if key[1] == "outs"]
    for stage, kind, path in changed:
        print(f"relock_code: {stage}: {kind} {path}")
    if outs:
        print(f"relock_code: warning: {len(outs)} output hash(es) changed: these outputs are present and "
              "differ from the last run; re-run their stages instead", file=sys.stderr)
    print(f"relock_code: {len(changed)} entries re-recorded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
