"""``python -m pipeline.profiles [--profile quick] [--data SOURCE]``: run the whole pipeline as a DVC
experiment with a profile's settings (``profiles/<name>.yaml``) and, optionally, your own data source,
in one command (``make repro PROFILE=quick DATA=imagefolder:/path/to/images``), with a progress line
per stage (which one, elapsed, and what is left, estimated from this run's last time here).
``--repro`` runs plain ``dvc repro`` on ``params.yaml`` as it is (``make repro``), with the same lines.

The settings become ``dvc exp run -S key=value`` overrides, so DVC records them with the experiment
and writes them into ``params.yaml`` the way it always does (its comments kept); ``dvc exp show``
lists the run beside the others. Everything is checked before anything runs: the merged params
against the schema, and a data folder's existence. When the run ends the command says where the
model, the metrics and the plots are."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline import exit_codes
from pipeline.data.sources import check_source
from pipeline.params.config import ConfigError, deep_merge, load_params
from pipeline.params.schema import check_params
from pipeline.report.progress import FIRST_RUN_HINT, TIMES_FILE, StageProgress, load_times, save_times

PROFILES = Path("profiles")
WHERE = (
    ("model directory", "models/cascade/ (cascade recognize --model models/cascade IMAGE ...)"),
    ("registered model", "MLflow registry, its name and version in metrics/register.json (model_name, version)"),
    ("metrics", "metrics/headline.json (dvc metrics show), metrics/evaluate.json (every figure)"),
    ("plots", "plots/ (dvc plots show), MLflow runs (make mlflow-ui)"),
)


def settings(overlay: Mapping[str, Any], base: Mapping[str, Any], prefix: str = "") -> list[str]:
    """An overlay as ``key=value`` overrides, one per leaf, values in YAML flow style (what ``dvc exp
    run -S`` parses); a mapping is split into its keys, so keys it does not name keep their values. A
    key ``base`` (params.yaml) does not hold is written ``+key=value`` (DVC adds it)."""
    out = []
    for key, value in overlay.items():
        name, there = f"{prefix}{key}", isinstance(base, Mapping) and key in base
        if isinstance(value, Mapping) and value and there and isinstance(base[key], Mapping):
            out.extend(settings(value, base[key], f"{name}."))
        else:
            text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
            out.append(f"{'' if there else '+'}{name}={text.removesuffix('...').strip()}")
    return out


def profile_overlay(profile: str | None, data: str | None, root: Path = Path(".")) -> dict[str, Any]:
    """The profile's overrides with ``data.source`` set to ``data`` when given."""
    overlay: dict[str, Any] = {}
    if profile:
        path = root / PROFILES / f"{profile}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in (root / PROFILES).glob("*.yaml"))
            raise ConfigError(f"no profile {profile!r} ({path} is missing); profiles: {', '.join(known)}")
        overlay = load_params(path)
    if data:
        overlay = deep_merge(overlay, {"data": {"source": data}})
    return overlay


def command(overlay: Mapping[str, Any], base: Mapping[str, Any], extra: list[str], repro: bool = False) -> list[str]:
    """The DVC command line (``dvc`` first, resolved by :func:`find_dvc` when it runs): ``dvc repro``
    for ``--repro``, else an experiment with the overlay's settings."""
    if repro:
        return ["dvc", "repro", *extra]
    return ["dvc", "exp", "run", *[arg for s in settings(overlay, base) for arg in ("-S", s)], *extra]


class DvcMissing(RuntimeError):
    """No ``dvc`` executable beside this Python nor on PATH."""


def find_dvc(python: str | None = None, path: str | None = None) -> str:
    """The ``dvc`` to run: the one beside ``python`` (default: this Python) first, the virtualenv's, so
    ``.venv/bin/python -m pipeline.profiles`` works with the virtualenv off PATH; else the first on
    ``path`` (default: PATH)."""
    python = python or sys.executable
    beside = Path(python).parent / "dvc"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("dvc", path=path)
    if found is None:
        raise DvcMissing(f"no dvc beside {python} nor on PATH: run `make setup` (it installs DVC into .venv), "
                         f"or put the virtualenv's bin on PATH (source .venv/bin/activate)")
    return found


def dvc_env(dvc: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment DVC runs in: ``dvc``'s folder first on PATH, so the stages' ``python -m stages.X``
    (dvc.yaml) run with the same virtualenv's Python as DVC itself, activated or not."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = os.pathsep.join([str(Path(dvc).parent), *filter(None, [env.get("PATH")])])
    return env


def stage_names(dvc: str = "dvc", env: Mapping[str, str] | None = None) -> list[str]:
    """Every stage of dvc.yaml in DVC's order (``dvc stage list``; empty if DVC cannot list them)."""
    try:
        out = subprocess.run([dvc, "stage", "list", "--name-only"], capture_output=True, text=True,
                             check=False, env=env)
    except OSError:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def run_with_progress(cmd: list[str], progress: StageProgress, env: Mapping[str, str] | None = None) -> int:
    """Run ``cmd``, passing its output through unchanged, with a progress line after each line where
    DVC starts a stage; returns its exit status."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    out, pending = sys.stdout.buffer, b""
    while chunk := proc.stdout.read1(65536):
        # A chunk can end mid-line: each note goes right after its own line, and a partial line
        # (a progress bar's \r updates) passes through at once, to be parsed when its newline comes.
        *complete, tail = chunk.split(b"\n")
        for segment in complete:
            out.write(segment + b"\n")
            note = progress.feed((pending + segment).decode(errors="replace"))
            pending = b""
            if note:
                out.write(f"{note}\n".encode())
        out.write(tail)
        pending += tail
        out.flush()
    return proc.wait()


def verdict_lines(root: Path) -> list[str]:
    """What the run shipped and whether it is dominated, from ``metrics/``: the input it chose, the
    cascade on test against the run's other models, and the registry's decision."""
    lines = []
    ingest, evaluated, registered = (root / "metrics" / f for f in ("ingest.json", "evaluate.json", "register.json"))
    if ingest.is_file():
        reason = json.loads(ingest.read_text()).get("input", {}).get("reason")
        if reason:
            lines.append(f"  input             {reason}")
    if evaluated.is_file():
        shipped = json.loads(evaluated.read_text()).get("shipped")
        if shipped:
            name = shipped.get("model", "cascade")
            if name != "cascade":  # a plain CNN the held-out images preferred (calibrate says why)
                lines.append(f"  shipped           {name}, not the cascade: it read better on the held-out images")
            lines.append(f"  shipped {name:<10}{100 * shipped['accuracy']:.2f}% at {shipped['mean_macs'] / 1e6:.2f} M "
                         f"MACs on {shipped['test_images']} test images: {shipped['verdict']}")
    if registered.is_file():
        r = json.loads(registered.read_text())
        state = "champion" if r.get("passed") else "challenger only"
        lines.append(f"  registry          {r.get('model_name')} v{r.get('version')} is {state}")
    return lines


def changed_files(root: Path) -> list[str]:
    """Tracked files the run left modified (``git status``), e.g. params.yaml, dvc.lock, metrics/."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                         text=True, check=False)
    return [line[3:] for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def closing_lines(root: Path, merged: Mapping[str, Any]) -> list[str]:
    """The run's last lines: the verdict, and how to get the committed results back when a run on other
    data left them modified in this workspace (DVC runs an experiment in the workspace)."""
    lines = verdict_lines(root)
    changed = changed_files(root)
    if changed and str(merged["data"]["source"]) != "fashion-mnist":
        lines += [f"\nThis run replaced the committed results in this workspace ({len(changed)} tracked files: "
                  f"{', '.join(changed[:4])}{', ...' if len(changed) > 4 else ''}).",
                  "  It is saved as a DVC experiment (dvc exp show). To get the committed ones back:",
                  "  git checkout -- .   (params.yaml, dvc.lock, metrics/), then dvc checkout (models and data,",
                  "  where this workspace's DVC cache holds them; else dvc repro rebuilds them)"]
    return lines


def run_pipeline(cmd: list[str], kind: str, hint: str | None) -> int:
    """Run the DVC command ``cmd`` with a progress line per stage; record the stages' seconds for the
    next run of ``kind`` when it succeeds. Returns DVC's exit status (2 when no dvc is found)."""
    try:
        dvc = find_dvc()
    except DvcMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    env = dvc_env(dvc)
    progress = StageProgress(stage_names(dvc, env), load_times(TIMES_FILE, kind), hint)
    status = run_with_progress([dvc, *cmd[1:]], progress, env)
    if status == 0:
        save_times(TIMES_FILE, kind, progress.finish())
    else:
        verb = "dvc exp run" if cmd[1:2] == ["exp"] else "dvc repro"
        print(f"error: {verb} failed (exit {status}); the failing stage's message is above", file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    known = ", ".join(sorted(q.stem for q in PROFILES.glob("*.yaml")))
    p = argparse.ArgumentParser(prog="python -m pipeline.profiles", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=f"Profiles: {known}")
    p.add_argument("--profile", default=None, help="profiles/<name>.yaml (e.g. quick); default: none")
    p.add_argument("--data", default=None,
                   help="data.source: imagefolder:<dir>, idx:<dir>, fashion-mnist or digits "
                        "(default: params.yaml's)")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--repro", action="store_true",
                   help="plain `dvc repro` on the params file as it is (make repro), not an experiment")
    p.add_argument("--dry-run", action="store_true", help="check and print the dvc command, run nothing")
    p.add_argument("extra", nargs="*", help="more arguments for dvc exp run / dvc repro (after --), e.g. -n NAME")
    args = p.parse_args(argv)
    if args.repro and (args.profile or args.data):
        p.error("--repro runs params.yaml as it is: --profile and --data make an experiment (drop --repro)")
    try:
        overlay = profile_overlay(args.profile, args.data)
        base = load_params(args.params)
        merged = deep_merge(base, overlay)
        check_params(merged, source=f"{args.params} + {args.profile or '-'} profile")
        check_source(str(merged["data"]["source"]))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.PARAMS
    cmd = command(overlay, base, args.extra, repro=args.repro)
    print("running: " + " ".join(cmd), flush=True)
    if args.dry_run:
        return 0
    status = run_pipeline(cmd, f"{args.profile or 'default'} | {merged['data']['source']}",
                          FIRST_RUN_HINT.get(args.profile or "default"))
    if status != 0:
        return status
    print("\ndone. Outputs:")
    for what, where in WHERE:
        print(f"  {what:17s} {where}")
    for line in closing_lines(Path("."), merged):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
