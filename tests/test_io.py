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


def test_atomic_path_removes_what_a_killed_writer_left_and_spares_a_live_one(tmp_path):
    import os
    import subprocess
    import sys
    import time

    from pipeline.io import OWNER_FILE, atomic_path, stale_temporaries

    final = tmp_path / "select"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    killed = tmp_path / ".select.killed"
    (killed / "select").mkdir(parents=True)
    (killed / OWNER_FILE).write_text(dead.stdout.strip())  # that process has exited
    live = tmp_path / ".select.live"
    live.mkdir()
    (live / OWNER_FILE).write_text(str(os.getpid()))
    unowned = tmp_path / ".select.old"
    unowned.mkdir()
    os.utime(unowned, (time.time() - 3600, time.time() - 3600))
    assert stale_temporaries(final) == [killed, unowned]
    with atomic_path(final, is_dir=True) as tmp:
        (tmp / "selection.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".select.live", "select"]
