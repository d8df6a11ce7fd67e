"""The docs' generated tables equal what their JSON gives, and a figure that parts from its JSON is caught."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.report import doc_tables
from pipeline.report.doc_tables import BLOCKS, ROOT, DocTablesError, fill, stale_blocks, write_all


def _copy(tmp_path: Path) -> Path:
    """The docs and the JSON the blocks read, copied under ``tmp_path``."""
    architect = {rel for _, rel in doc_tables.ARCHITECT}
    for rel in {b.doc for b in BLOCKS.values()} | {doc_tables.EVALUATE, doc_tables.ANCHORS, *architect}:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_every_generated_block_in_the_docs_matches_its_json() -> None:
    assert stale_blocks(ROOT) == [], "run: python -m pipeline.report.doc_tables"


def test_a_figure_edited_by_hand_is_caught_and_rewritten(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    readme = root / "README.md"
    text = readme.read_text()
    shipped = json.loads((root / doc_tables.EVALUATE).read_text())["cascade"]["accuracy"]
    figure = f"**{100 * shipped:.2f}%**"
    assert figure in text
    readme.write_text(text.replace(figure, "**99.99%**", 1))
    assert stale_blocks(root) == ["README.md: readme-results"]
    assert write_all(root) == ["README.md: readme-results"]
    assert readme.read_text() == text and stale_blocks(root) == []


def test_new_data_moves_the_table(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    path = root / doc_tables.EVALUATE
    evaluation = json.loads(path.read_text())
    evaluation["baselines"]["plain_large"]["accuracy"] = 0.5
    path.write_text(json.dumps(evaluation))
    stale = stale_blocks(root)
    assert "README.md: readme-results" in stale and "docs/RESULTS.md: results-anchors" in stale
    write_all(root)
    assert "| 50.00% /" in (root / "README.md").read_text()


def test_a_missing_marker_names_the_doc_and_the_block() -> None:
    with pytest.raises(DocTablesError, match=r"README.md: needs exactly one block <!-- generated:x -->"):
        fill("no markers here", "x", "body", Path("README.md"))


def test_check_exits_1_and_names_the_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _copy(tmp_path)
    results = root / "docs" / "RESULTS.md"
    start = results.read_text().index("<!-- generated:results-budget-curve -->")
    text = results.read_text()
    results.write_text(text[:start] + text[start:].replace("%", "%%", 1))
    assert doc_tables.main(["--check", "--root", str(root)]) == 1
    assert "docs/RESULTS.md: results-budget-curve: differs from its JSON" in capsys.readouterr().out
    assert doc_tables.main(["--root", str(root)]) == 0
    assert doc_tables.main(["--check", "--root", str(root)]) == 0
