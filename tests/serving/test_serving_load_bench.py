"""bench/serving_load.py: the pure parts (load steps, hey's CSV per second, the point in use per second,
the probe's accuracy beside the held-out figure of the points used, the recovery after a fall), how it
reads /metrics and the answers, its refusals of bad input, and one short run on the calibrated tiny model
(bench.serving_load, bench.serving_load_stats, bench.serving_load_probe)."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from bench import serving_load
from bench.serving_load_probe import judge, read_metrics
from bench.serving_load_stats import (
    HeyRow,
    ProbeAnswer,
    Scrape,
    Step,
    falls,
    hey_rows,
    mode_report,
    parse_steps,
    per_second,
    phase_latency,
    points_per_second,
    probe_accuracy,
    recovery,
    weighted_held_out,
)
from pipeline.io import Split, save_split
from tests.routing.test_package import uint8_images

HEY_CSV = """response-time,DNS+dialup,DNS,Request-write,Response-delay,Response-read,status-code,offset
0.0100,0.0001,0.0000,0.0000,0.0099,0.0000,200,0.1000
0.0300,0.0000,0.0000,0.0000,0.0300,0.0000,200,0.9000
0.0500,0.0000,0.0000,0.0000,0.0500,0.0000,503,1.2000
"""


def test_steps_parse_and_bad_steps_are_named() -> None:
    assert parse_steps("16:20,128:20, 16:20") == [Step(16, 20.0), Step(128, 20.0), Step(16, 20.0)]
    assert parse_steps("16:20:5,128:20:1.25") == [Step(16, 20.0, 5.0), Step(128, 20.0, 1.25)]
    assert Step(128, 20, 1.25).load > Step(16, 20, 5).load and Step(2, 5).load > Step(128, 20, 1.25).load
    for bad in ("16", "a:3", "0:5", "16:0", "16:nan", "16:20,", "2000:5", "4:2:1:1", "4:2:0", "4:2:x"):
        with pytest.raises(ValueError, match="load step"):
            parse_steps(bad)


def test_a_steps_clients_are_split_into_hey_processes_of_a_set_size() -> None:
    assert serving_load.hey_groups(128, 16) == [16] * 8
    assert serving_load.hey_groups(20, 16) == [16, 4]
    assert serving_load.hey_groups(3, 1) == [1, 1, 1] and serving_load.hey_groups(3, 8) == [3]


def test_hey_rows_are_placed_on_the_run_clock_and_bucketed_by_start_second() -> None:
    rows = hey_rows(HEY_CSV, phase_start=3.5)
    assert [r.start for r in rows] == pytest.approx([3.6, 4.4, 4.7])
    assert [r.status for r in rows] == [200, 200, 503]
    seconds = per_second(rows, per_request=4, seconds=6)
    assert [s["requests"] for s in seconds] == [0, 0, 0, 1, 2, 0]
    assert seconds[4]["non_200"] == 1 and seconds[4]["images_per_s"] == 4  # only the 200 counts, x4 images
    assert seconds[3]["p50_ms"] == pytest.approx(10.0) and seconds[0]["p99_ms"] is None
    many = [HeyRow(0.5, ms / 1e3, 200) for ms in range(1, 101)]
    row = per_second(many + [HeyRow(-0.1, 9.0, 200), HeyRow(1.0, 9.0, 200)], 1, 1)[0]
    assert row["requests"] == 100  # rows outside [0, 1) left out
    assert row["p50_ms"] == pytest.approx(np.percentile(np.arange(1, 101), 50))
    assert row["p99_ms"] == pytest.approx(np.percentile(np.arange(1, 101), 99))
    assert row["p50_ms"] < row["p99_ms"] <= 100
    # refusals (5 ms) among slow answers (150 ms): the answers' p99 is theirs, not lowered by the refusals
    mixed = [HeyRow(0.5, 0.150, 200)] * 10 + [HeyRow(0.5, 0.005, 429)] * 90
    row = per_second(mixed, 1, 1)[0]
    assert row["p99_ms"] == pytest.approx(150.0) and row["p50_ms"] == pytest.approx(5.0)
    assert row["p99_ok_ms"] == pytest.approx(150.0) and row["p99_refused_ms"] == pytest.approx(5.0)
    assert phase_latency(mixed, [{**row, "t": 2}], 0.0, 3.0, 1, 100.0)["seconds_over_target"] == 1


def test_the_point_in_use_per_second_is_the_most_scraped_and_requests_are_counter_deltas() -> None:
    scrapes = [Scrape(0.1, "accurate", {"accurate": 5}), Scrape(0.6, "accurate", {"accurate": 9}),
               Scrape(1.2, "p1", {"accurate": 12, "p1": 1}), Scrape(1.7, "accurate", {"accurate": 13, "p1": 4}),
               Scrape(2.4, "p2", {"accurate": 13, "p1": 4, "p2": 7})]
    rows = points_per_second(scrapes, 4)
    assert [r["point"] for r in rows] == ["accurate", "accurate", "p2", None]  # second 1: a tie, the later wins
    assert rows[0]["requests_per_point"] == {"accurate": 9}
    assert rows[1]["requests_per_point"] == {"accurate": 4, "p1": 4}
    assert rows[2]["requests_per_point"] == {"p2": 7} and rows[3]["requests_per_point"] == {}
    assert [r["engine_busy"] for r in rows] == [None, 0.0, 0.0, None]  # no engine seconds recorded


def test_the_engine_busy_share_per_second_is_engine_seconds_over_wall_seconds() -> None:
    scrapes = [Scrape(0.5, "accurate", {}, 0.0), Scrape(1.5, "accurate", {}, 0.25), Scrape(2.5, "p1", {}, 1.15)]
    rows = points_per_second(scrapes, 3)
    assert rows[0]["engine_busy"] is None  # no scrape before second 0
    assert rows[1]["engine_busy"] == pytest.approx(0.25) and rows[2]["engine_busy"] == pytest.approx(0.9)


def test_probe_accuracy_is_weighed_against_the_held_out_accuracy_of_the_points_it_was_answered_at() -> None:
    answers = [ProbeAnswer(0.1, 200, "accurate", (1, 2, 3), 3, 3), ProbeAnswer(0.2, 200, "p1", (1,), 0, 1),
               ProbeAnswer(0.3, 503, None, (), 0, 1)]
    out = probe_accuracy(answers, {"accurate": 0.9, "p1": 0.8, "exit1": 0.5})
    assert out["images"] == 4 and out["non_200"] == 1
    assert out["accuracy"] == pytest.approx(0.75)
    assert out["se"] == pytest.approx(math.sqrt(0.75 * 0.25 / 4))
    assert out["shares"] == {"accurate": 0.75, "p1": 0.25}
    assert out["held_out_weighted"] == pytest.approx(0.75 * 0.9 + 0.25 * 0.8)
    assert out["difference"] == pytest.approx(0.75 - 0.875)
    assert weighted_held_out({"accurate": 1.0, "p9": 0.0}, {"accurate": 0.9}) is None  # no figure for p9
    assert probe_accuracy([], {"accurate": 0.9})["accuracy"] is None


def test_recovery_counts_from_the_fall_to_the_first_scrape_back_at_accurate() -> None:
    steps = [Step(16, 20), Step(128, 20), Step(16, 20)]
    assert falls(steps, [0.0, 20.1, 40.3, 60.4]) == [(40.3, 60.4)]
    steps = [Step(2, 2), Step(4, 2), Step(2, 2), Step(4, 2), Step(2, 2)]
    assert falls(steps, [0, 2, 4, 6, 8, 10]) == [(4, 6), (8, 10)]
    scrapes = [Scrape(39.0, "p3", {}), Scrape(40.5, "p2", {}), Scrape(42.8, "accurate", {}), Scrape(43.0, "p1", {})]
    assert recovery(scrapes, 40.3, 60.4) == pytest.approx(2.5)
    assert recovery([Scrape(40.4, "accurate", {})], 40.3, 60.4) == pytest.approx(0.1)
    assert recovery(scrapes, 40.3, 42.0) is None  # not back before the next rise
    assert recovery([Scrape(41.0, "p1", {})], 40.3, 60.4) is None
    assert recovery([Scrape(40.1, "accurate", {}), Scrape(40.4, "accurate", {})], 40.3, 60.4) == 0.0  # never left


def test_a_mode_report_summarises_each_step_and_the_high_load_step() -> None:
    steps = [Step(2, 2), Step(4, 2), Step(2, 2)]
    starts = [0.0, 2.0, 4.0, 6.0]
    rows = [HeyRow(t + 0.5, 0.01 * (1 + (t >= 2)), 200) for t in range(6) for _ in range(10)]
    scrapes = [Scrape(t + 0.25, "p1" if 2 <= t < 5 else "accurate", {"accurate": 10 * t}) for t in range(6)]
    answers = [ProbeAnswer(t + 0.6, 200, "p1" if 2 <= t < 4 else "accurate", (1,), t % 2, 1) for t in range(6)]
    out = mode_report(steps, starts, rows, scrapes, answers, 1, {"accurate": 0.9, "p1": 0.7}, target_ms=15)
    assert [r["clients"] for r in out["seconds"]] == [2, 2, 4, 4, 2, 2]
    assert [r["point"] for r in out["seconds"]] == ["accurate", "accurate", "p1", "p1", "p1", "accurate"]
    assert [p["requests"] for p in out["phases"]] == [20, 20, 20]
    assert out["phases"][1]["probe"]["shares"] == {"p1": 1.0}
    assert out["phases"][1]["requests_per_point"] == {"accurate": 20}
    assert out["high_load"]["phases"] == [1]
    assert out["high_load"]["probe"]["held_out_weighted"] == pytest.approx(0.7)
    assert out["recovery_s"] == [{"fall": 4.0, "back_at_accurate_s": pytest.approx(1.25)}]


def test_the_metrics_and_the_answers_are_read_as_the_server_writes_them() -> None:
    from prometheus_client import CollectorRegistry

    from pipeline.serving.metrics import ServingMetrics, exposition

    registry = CollectorRegistry()
    metrics = ServingMetrics(registry)
    names = ["accurate", "p1", "exit1"]
    metrics.in_use("accurate", 100.0, names, changed=False)
    metrics.answered([1, 2], "accurate")
    metrics.in_use("p1", 50.0, names, changed=True)
    for _ in range(3):
        metrics.answered([1], "p1")
    scrape = read_metrics(exposition(registry)[0].decode(), 1.5)
    assert scrape == Scrape(1.5, "p1", {"accurate": 1.0, "p1": 3.0})
    body = json.dumps({"predictions": [{"class_index": 2, "exit": 1}, {"class_index": 0, "exit": 3}],
                       "operating_point": {"name": "p1", "accuracy": 0.8, "mean_macs": 50.0}}).encode()
    assert judge(0.7, 200, body, np.array([2, 1])) == ProbeAnswer(0.7, 200, "p1", (1, 3), 1, 2)
    assert judge(0.7, 503, b"{}", np.array([2])) == ProbeAnswer(0.7, 503, None, (), 0, 1)


def _split(directory: Path, n: int = 64, model: Path | None = None) -> Path:
    """A test split of the tiny model's images, labelled at random or by ``model``'s own answers at its
    accuracy-first point (so an answer judged against the wrong image's label shows)."""
    images = uint8_images(n, seed=41)
    labels = np.random.default_rng(1).integers(0, 4, n)
    if model is not None:
        from pipeline.serving.engines import load_engine

        labels = np.array([r["class_index"] for r in load_engine(model, "torch").recognize(images)])
    save_split(directory / "test.npz", Split("test", images, labels, np.array([f"t{i}" for i in range(n)])))
    return directory


def test_bad_input_is_refused_by_name_before_a_server_starts(points_model: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    data = _split(tmp_path)
    out = tmp_path / "out.json"
    cases = [(["--model", str(tmp_path / "none"), "--data", str(data)], "no model directory"),
             (["--model", str(data), "--data", str(data)], "not a cascade model directory"),
             (["--model", "models:/cascade", "--data", str(data)], "must be models:/<name>@<alias>"),
             (["--model", str(points_model), "--data", str(tmp_path / "nodata")], "no test split"),
             (["--model", str(points_model), "--data", str(data), "--steps", "8:x"], "--steps: load step '8:x'"),
             (["--model", str(points_model), "--data", str(data), "--images-per-request", "0"], "--images-per-request"),
             (["--model", str(points_model), "--data", str(data), "--p99-ms", "-5"], "--p99-ms"),
             (["--model", str(points_model), "--data", str(data), "--clients-per-hey", "0"], "--clients-per-hey")]
    for argv, says in cases:
        with pytest.raises(SystemExit) as exc:
            serving_load.main([*argv, "--out", str(out)])
        assert exc.value.code == 2 and says in capsys.readouterr().err
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SystemExit):
        serving_load.main(["--model", str(points_model), "--data", str(data), "--out", str(out)])
    assert "hey is not installed" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(shutil.which("hey") is None, reason="hey is not installed (scripts/setup.sh)")
def test_a_short_load_step_is_measured_with_and_without_a_target(points_model: Path, tmp_path: Path) -> None:
    data, out, png = _split(tmp_path, 96, points_model), tmp_path / "load.json", tmp_path / "load.png"
    began = time.monotonic()
    assert serving_load.main(["--model", str(points_model), "--data", str(data), "--steps", "2:2,4:2,2:2",
                              "--images-per-request", "4", "--p99-ms", "20", "--probes", "1", "--warmup", "0.5",
                              "--clients-per-hey", "2",
                              "--out", str(out), "--plot", str(png)]) == 0
    report = json.loads(out.read_text())
    assert set(report["modes"]) == {"none", "p99"} and png.stat().st_size > 0
    names = set(report["held_out"])
    for run in report["modes"].values():
        assert len(run["seconds"]) == int(run["phases"][-1]["end"]) >= 6
        assert [p["clients"] for p in run["phases"]] == [2, 4, 2]
        # no answer but 200 or, under the target, admission's 429 (a request predicted to miss 20 ms)
        assert all(p["requests"] > 0 and p["non_200"] == p["refused"] and p["images_per_s"] > 0
                   for p in run["phases"])
        assert {r["point"] for r in run["seconds"]} <= names | {None}
        assert set(run["high_load"]["probe"]["shares"]) <= names
    none = report["modes"]["none"]
    # the probe is answered where nothing is refused; under the 20 ms target admission may refuse it all
    probe = none["high_load"]["probe"]
    assert probe["images"] > 0 and probe["held_out_weighted"] is not None
    assert 0 < sum(r["probe_images"] for r in none["seconds"]) <= sum(p["probe"]["images"] for p in none["phases"])
    assert all(p["refused"] == 0 for p in none["phases"])  # no target, no deadline: nothing is refused
    assert {r["point"] for r in none["seconds"]} <= {"accurate", None}  # no target: the point never moves
    assert none["recovery_s"][0]["back_at_accurate_s"] == 0.0
    assert none["high_load"]["probe"]["accuracy"] >= 0.95  # the labels are its own answers at 'accurate'
    assert time.monotonic() - began < 60
