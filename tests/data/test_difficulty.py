"""How hard the data is (pipeline.data.difficulty): grade's mean score as a share of chance level's, read
from the scores it wrote; bad score files are named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.data.difficulty import HARD_SHARE, data_is_hard, hard_setting_applies, read_scores, relative_difficulty


def write_scores(folder: Path, scores: list) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = "".join(f"{i},0,{s},1\n" for i, s in enumerate(scores))
    (folder / "scores.csv").write_text("id,label,score,level\n" + rows)
    return folder


def test_relative_difficulty_is_a_share_of_chance_level() -> None:
    assert relative_difficulty(np.array([0.0, 0.0]), 10) == 0.0
    assert relative_difficulty(np.full(5, 0.9), 10) == pytest.approx(1.0)  # the grader guesses among 10
    assert relative_difficulty(np.full(5, 0.5), 2) == pytest.approx(1.0)
    assert relative_difficulty(np.full(5, 0.25), 5) == pytest.approx(0.3125)
    with pytest.raises(ValueError, match="at least 2 classes"):
        relative_difficulty(np.ones(3), 1)


@pytest.mark.parametrize(("mean_score", "classes", "hard"), [
    (0.826, 6, True),    # the scenes folder: a linear model on the pixels at chance
    (0.374, 6, False),   # fashion-grey-28
    (0.261, 5, False),   # shop-colour-48
    (0.107, 10, False),  # digits-grey-32
    (0.75 * HARD_SHARE, 4, True),  # exactly on the line: 0.75 x 0.75 of chance (0.75) is hard
])
def test_data_is_hard_from_the_scores_grade_wrote(tmp_path: Path, mean_score: float, classes: int,
                                                   hard: bool) -> None:
    folder = write_scores(tmp_path / "graded", [mean_score, mean_score])
    assert data_is_hard(folder, classes) is hard
    assert hard_setting_applies(1200, folder, classes) is hard
    assert hard_setting_applies(0, tmp_path / "no-scores-read", classes) is False  # unset: nothing is read
    assert hard_setting_applies(None, tmp_path / "no-scores-read", classes) is False
    assert hard_setting_applies(True, folder, classes) is hard  # any setting that is on


HEADER = "id,label,score,level\n"


@pytest.mark.parametrize("body", ["id,label,level\n1,0,1\n", HEADER, HEADER + "1,0,x,1\n", HEADER + "1,0,nan,1\n"])
def test_a_bad_scores_file_is_named(tmp_path: Path, body: str) -> None:
    (tmp_path / "scores.csv").write_text(body)
    with pytest.raises(ValueError, match="scores.csv"):
        read_scores(tmp_path)
    with pytest.raises(ValueError, match="scores.csv"):
        read_scores(tmp_path / "missing")
