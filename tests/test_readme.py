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


def test_documents_name_only_modules_that_exist() -> None:
    """Every ``pipeline/...py`` path and dotted ``pipeline.<room>...`` name in the README, docs/*.md,
    the Makefile and dvc.yaml points at a file or module that exists (so a moved module leaves no stale
    reference behind); a dotted name may go on past the module into its attributes."""
    lib = ROOT / "pipeline"
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts[:-1] if p.stem == "__init__"
                        else p.relative_to(ROOT).with_suffix("").parts) for p in lib.rglob("*.py")}
    stale = []
    for doc in [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "Makefile", ROOT / "dvc.yaml"]:
        text = doc.read_text()
        stale += [f"{doc.name}: {m}" for m in re.findall(r"(?<![\w/.])(pipeline/[\w/]+\.py)\b", text)
                  if not (ROOT / m).is_file()]
        for name in re.findall(r"(?<![\w/.])(pipeline(?:\.\w+)+)", text):
            parts = name.split(".")
            if not any(".".join(parts[:i]) in modules for i in range(2, len(parts) + 1)):
                stale.append(f"{doc.name}: {name}")
    assert not stale, stale
