"""``python -m pipeline.check_params [--params params.yaml] [--overlay profiles/tiny.yaml ...]``: check the
whole params file against :mod:`pipeline.params.schema` (every key, type, range; unknown keys) and
print every problem, exit status 1; a data folder that does not exist is an error too. Prints ``ok``
and exits 0 when the file is sound. ``make repro`` runs the same check (``python -m pipeline.profiles
--repro``) before ``dvc repro``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline import exit_codes
from pipeline.data.sources import check_source
from pipeline.params.config import ConfigError, deep_merge, load_params
from pipeline.params.schema import check_params


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.check_params", description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=Path, default=Path("params.yaml"),
                   help="params file (default: params.yaml)")
    p.add_argument("--overlay", type=Path, action="append", default=[],
                   help="overrides laid over the params file first (e.g. profiles/tiny.yaml); repeatable")
    args = p.parse_args(argv)
    try:
        params = load_params(args.params)
        for overlay in args.overlay:
            params = deep_merge(params, load_params(overlay))
        check_params(params, source=" + ".join(str(x) for x in [args.params, *args.overlay]))
        check_source(str(params["data"]["source"]))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.PARAMS
    print(f"{args.params}: ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
