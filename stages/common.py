"""What every stage CLI shares: argument parsing, params loading, and turning known errors into a
one-line message and a non-zero exit."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline import exit_codes
from pipeline.data.sources import DataError
from pipeline.params.config import ConfigError, load_checked_params
from pipeline.train.lifetime import die_with_runner


class StageFailed(RuntimeError):
    """A check inside a stage failed; the message says which."""


def parser(stage: str, doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m stages.{stage}", description=(doc or "").strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: params.yaml)")
    p.add_argument("--root", type=Path, default=Path("."),
                   help="repository root: git commit and the default MLflow store (default: .)")
    return p


def params_of(args: argparse.Namespace) -> dict[str, Any]:
    """The params file, checked in full (every key, type, range; unknown keys) before the stage does
    anything: a bad key anywhere fails every stage at once, named. A section missing altogether is left
    to the stage that reads it (``partial``), so a stage can run on a file holding only its sections;
    ``python -m pipeline.check_params`` (``make repro``) requires every section."""
    return load_checked_params(args.params, partial=True)


def module_number(text: str) -> int:
    """``--module``: the module's key in params ``modules`` (``m3``, what dvc.yaml's ``foreach`` passes)
    or its 1-based number (``3``)."""
    digits = text[1:] if text[:1] in ("m", "M") else text
    if not digits.isdigit() or int(digits) < 1:
        raise argparse.ArgumentTypeError(f"must be a module key m1, m2, ... or its number 1, 2, ..., "
                                         f"got {text!r}")
    return int(digits)


def cli(fn: Callable[[list[str] | None], None]) -> Callable[[list[str] | None], int]:
    """Wrap a stage's main: known errors print ``error: ...`` to stderr and exit with their kind's
    status (:mod:`pipeline.exit_codes`: 3 params, 4 data, 5 a failed check; set ``CASCADE_DEBUG=1`` for
    the traceback); anything else is a bug and raises (status 1)."""

    @functools.wraps(fn)
    def wrapper(argv: list[str] | None = None) -> int:
        if os.environ.get("DVC_STAGE"):  # run by dvc: die with it
            die_with_runner()
        try:
            fn(argv)
        except (ConfigError, DataError, StageFailed, FileNotFoundError, ValueError) as exc:
            if os.environ.get("CASCADE_DEBUG"):
                raise
            print(f"error: {exc}", file=sys.stderr)
            return exit_codes.CHECK if isinstance(exc, StageFailed) else exit_codes.exit_code(exc) or 1
        return exit_codes.OK

    return wrapper
