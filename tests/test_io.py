import numpy as np
import pytest

from pipeline.io import curriculum_index


def test_curriculum_index_keeps_repeats_and_ids_with_spaces():
    ids = np.array(["train-0", "lucky seven/a b.png", "train-2"])
    lines = ["lucky seven/a b.png", "train-0", "", "train-0"]
    assert curriculum_index(ids, lines).tolist() == [1, 0, 0]


def test_curriculum_index_names_an_unknown_id():
    with pytest.raises(ValueError, match="train-9"):
        curriculum_index(np.array(["train-0"]), ["train-0", "train-9"])
