"""The documented black-box search example (docs/SEARCH.md) runs as written, and the README points
only inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SEARCH = ROOT / "docs" / "SEARCH.md"


def test_blackbox_search_example_runs(capsys) -> None:
    code = re.search(r"```python\n(.*?)```", SEARCH.read_text(), re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[-2].split()[2] in ("budget", "stop", "exhausted") and len(out) >= 3


def test_readme_names_only_files_in_the_repository() -> None:
    text = README.read_text()
    assert "../" not in text  # nothing outside the repository (the brief lives in docs/BRIEF.md)
    for name in re.findall(r"`(docs/[\w./-]+\.md)`", text):
        assert (ROOT / name).is_file(), name
    assert len(text.splitlines()) <= 300


def test_every_saved_result_is_cited_by_a_document() -> None:
    """docs/results/ holds the raw outputs behind docs/RESULTS.md's figures: each entry is named by some
    document or benchmark, so nothing there is an orphan nobody can place."""
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "bench").rglob("*.py")),
               *sorted((ROOT / "bench").rglob("README.md"))]
    text = "\n".join(p.read_text() for p in sources)
    orphans = [p.name for p in sorted((ROOT / "docs" / "results").iterdir()) if p.name not in text]
    assert not orphans, f"docs/results entries no document cites: {orphans}"
