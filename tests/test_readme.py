"""The README's black-box search example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_blackbox_search_example_runs(capsys) -> None:
    text = README.read_text()
    section = text[text.index("## Black-box search on your own space"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[-2].split()[2] in ("budget", "stop", "exhausted") and len(out) >= 3
