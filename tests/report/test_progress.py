"""pipeline.report.progress: the stage progress lines of `python -m pipeline.profiles`, and the timing record
their estimates come from."""

from __future__ import annotations

import json

from pipeline.report.progress import StageProgress, load_times, save_times

STAGES = ["ingest", "grade", "train@m1", "evaluate"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_first_run_names_the_stage_and_gives_the_documented_total() -> None:
    clock = Clock()
    p = StageProgress(STAGES, {}, "about 2-3 min for 2,000 images", clock=clock)
    assert p.feed("some stage output") is None
    line = p.feed("Running stage 'ingest':")
    assert line == ("[stage 1/4 ingest] elapsed 0 s; no timing of this run here yet "
                    "(about 2-3 min for 2,000 images in all)")
    clock.now = 30
    assert p.feed("Stage 'grade' didn't change, skipping") is None
    clock.now = 45
    line = p.feed("Running stage 'train@m1':")
    assert line.startswith("[stage 3/4 train@m1] elapsed 45 s")
    clock.now = 345
    p.feed("Running stage 'evaluate':")
    clock.now = 360
    assert p.finish() == {"ingest": 30.0, "train@m1": 300.0, "evaluate": 15.0}  # ingest: to the skip


def test_estimates_come_from_the_last_run() -> None:
    clock = Clock()
    previous = {"ingest": 10.0, "grade": 20.0, "train@m1": 300.0, "evaluate": 60.0}
    p = StageProgress(STAGES, previous, clock=clock)
    assert p.feed("Running stage 'ingest':") == ("[stage 1/4 ingest] elapsed 0 s; this stage took 10 s last "
                                                  "time; about 6.5 min left")
    clock.now = 10
    p.feed("Stage 'grade' didn't change, skipping")  # cached: nothing left to do there
    line = p.feed("Running stage 'train@m1':")
    assert line.endswith("this stage took 5.0 min last time; about 6.0 min left")
    # a stage that did not run this time keeps its last figure
    clock.now = 250
    p.feed("Running stage 'evaluate':")
    clock.now = 300
    assert p.finish() == {"ingest": 10.0, "grade": 20.0, "train@m1": 240.0, "evaluate": 50.0}


def test_an_unknown_stage_is_still_reported() -> None:
    p = StageProgress([], {}, clock=Clock())
    assert p.feed("Running stage 'new':").startswith("[stage 1/? new]")


def test_times_round_trip_per_kind(tmp_path) -> None:
    path = tmp_path / "sub" / "times.json"
    assert load_times(path, "quick | digits") == {}
    save_times(path, "quick | digits", {"ingest": 1.234})
    save_times(path, "default | fashion-mnist", {"ingest": 9.0})
    assert load_times(path, "quick | digits") == {"ingest": 1.2}
    assert set(json.loads(path.read_text())) == {"quick | digits", "default | fashion-mnist"}
    path.write_text("{not json")
    assert load_times(path, "quick | digits") == {}  # a broken record is no record, not a failure
    assert not list(path.parent.glob(".*.tmp"))
