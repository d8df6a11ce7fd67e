"""Every example of docs/SEARCH.md runs as written (the three forms: search(), ask/tell, the Optuna sampler)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SEARCH = Path(__file__).resolve().parents[2] / "docs" / "SEARCH.md"
BLOCKS = re.findall(r"```python\n(.*?)```", SEARCH.read_text(), re.S)


def test_the_three_forms_are_documented() -> None:
    text = "\n".join(BLOCKS)
    assert len(BLOCKS) >= 4 and "Searcher(" in text and "executor=" in text and "MethodBSampler(" in text


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_example_runs(number: int, capsys) -> None:
    code = BLOCKS[number]
    if "import optuna" in code:
        pytest.importorskip("optuna")
    exec(compile(code, f"docs/SEARCH.md, example {number + 1}", "exec"), {})
    assert capsys.readouterr().out.strip()  # each example prints its result
