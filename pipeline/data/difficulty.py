"""How hard the data is, from what ``grade`` already measured: the cheap grader's mean score (1 - its
out-of-fold probability of the true class) as a share of chance level's. Read before training, so a run
can give hard data more optimiser steps (``train.min_steps_hard``, ``baselines.min_steps_hard``)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

# Hard: the grader's mean score at or above this share of chance level's (1 - 1/K for K classes), i.e. a
# linear model on the pixels removes less than a quarter of chance's errors. Measured (docs/RESULTS.md
# "Your own images", "Hard data trains longer"): the scenes folder 0.99; every other folder 0.12-0.47.
HARD_SHARE = 0.75


def relative_difficulty(scores: np.ndarray, num_classes: int) -> float:
    """The grader's mean score as a share of chance level's: 0 = every image easy, 1 = the grader guesses."""
    if num_classes < 2:
        raise ValueError(f"relative_difficulty needs at least 2 classes, got {num_classes}")
    return float(np.mean(scores)) / (1.0 - 1.0 / num_classes)


def read_scores(graded: Path) -> np.ndarray:
    """The training images' scores grade wrote (``<graded>/scores.csv``, column ``score``)."""
    path = graded / "scores.csv"
    try:
        with path.open(newline="") as f:
            scores = np.array([float(row["score"]) for row in csv.DictReader(f)], dtype=np.float64)
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"{path}: cannot read the grade scores ({exc!r}); re-run the grade stage") from None
    if len(scores) == 0 or not np.isfinite(scores).all():
        raise ValueError(f"{path}: no scores, or a score that is not a number; re-run the grade stage")
    return scores


def is_hard(difficulty: float) -> bool:
    return difficulty >= HARD_SHARE


def data_is_hard(graded: Path, num_classes: int) -> bool:
    """Whether grade found the training data hard (``HARD_SHARE``)."""
    return is_hard(relative_difficulty(read_scores(graded), num_classes))


def hard_setting_applies(setting: object, graded: Path, num_classes: int) -> bool:
    """Whether a hard-data setting of the run (``min_steps_hard``) is set (not None, 0 or
    False) and grade found the data hard; the scores are read only then."""
    return setting not in (None, 0, False) and data_is_hard(graded, num_classes)
