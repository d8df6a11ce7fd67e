"""Shared ending of the ablation benches: each part's rows as a table, all of it to one JSON file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from pipeline.io import write_json


def report_parts(out: dict, parts: Sequence[str], path: Path, tag: str) -> Path:
    """Print the rows of each part in ``out`` as a table; write ``out`` to ``<stem>_<tag><suffix>``."""
    for part in parts:
        if part in out:
            print(f"\n{part}:\n" + pd.DataFrame(out[part]).to_string(index=False))
    target = path.with_name(f"{path.stem}_{tag}{path.suffix}")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json(target, out)
    return target
