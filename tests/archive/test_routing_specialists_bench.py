"""bench/archive/routing_specialists.py's pure parts: class groups from confusions, routing to a group's
specialist, the cascade read at a fixed exit-1 threshold (the bench itself needs a trained workspace)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.archive.routing_specialists import cascade_accuracy, confusion_groups, group_of, routed_logits


def test_confusion_groups_merge_the_most_confused_pairs_first() -> None:
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    pred = np.array([1, 1, 0, 1, 2, 2, 4, 3, 4, 4])  # 0<->1 three times, 3<->4 once
    assert confusion_groups(pred, labels, 5, 3) == [[0, 1], [2], [3, 4]]
    assert confusion_groups(pred, labels, 5, 4) == [[0, 1], [2], [3], [4]]
    assert confusion_groups(pred, labels, 5, 5) == [[0], [1], [2], [3], [4]]
    assert len(confusion_groups(pred, labels, 5, 1)) == 1  # unconfused classes still merge to reach 1


def test_group_of_maps_classes_to_their_group() -> None:
    groups = [[0, 2], [1], [3, 4]]
    assert group_of(torch.tensor([0, 1, 2, 3, 4]), groups).tolist() == [0, 1, 0, 2, 2]


def test_routed_logits_take_each_image_from_its_specialist() -> None:
    a, b = torch.zeros(3, 2), torch.ones(3, 2)
    out = routed_logits([a, b], torch.tensor([1, 0, 1]))
    assert out[:, 0].tolist() == [1.0, 0.0, 1.0]


def test_cascade_accuracy_lets_exit_1_answer_above_its_threshold() -> None:
    confident = torch.tensor([[10.0, 0.0], [0.0, 10.0], [0.1, 0.0], [0.0, 0.1]])  # images 2-3 are unsure
    exit2 = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])  # always class 1
    y = torch.tensor([0, 1, 1, 0])
    row = cascade_accuracy(confident, exit2, y, threshold=0.9)
    assert row["reaching"] == 2
    assert row["exit2_on_reaching"] == pytest.approx(50.0)
    assert row["accuracy"] == pytest.approx(75.0)
