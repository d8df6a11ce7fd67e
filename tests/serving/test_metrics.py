"""The cascade's Prometheus metrics (pipeline.serving.metrics), in one process, read back with
prometheus_client's own parser."""

from __future__ import annotations

import sys

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from pipeline.serving.metrics import ServingMetrics, enable_multiprocess, exposition, reason_of


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    text = exposition(registry)[0].decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_what_is_recorded_is_what_is_exposed() -> None:
    registry = CollectorRegistry()
    m = ServingMetrics(registry)
    m.answered([1, 1, 3], "accurate")
    m.answered([2], "p1")
    m.batch(2, 4, 0.004, [0.001, 0.002])
    m.refused(reason_of(413))
    m.refused("budget")
    m.in_use("p1", 1234.0, ["accurate", "p1", "exit1"], changed=True)
    m.responded(200, 0.01)
    got = samples(registry)
    assert got[("cascade_images_total", (("exit", "1"),))] == 2
    assert got[("cascade_images_total", (("exit", "3"),))] == 1
    assert got[("cascade_requests_total", (("point", "p1"),))] == 1
    assert got[("cascade_refusals_total", (("reason", "too_large"),))] == 1
    assert got[("cascade_refusals_total", (("reason", "budget"),))] == 1
    assert got[("cascade_operating_point", (("point", "p1"),))] == 1
    assert got[("cascade_operating_point", (("point", "accurate"),))] == 0
    assert got[("cascade_operating_point_macs", ())] == 1234.0
    assert got[("cascade_operating_point_changes_total", ())] == 1
    assert got[("cascade_batch_images_count", ())] == 1 and got[("cascade_batch_images_sum", ())] == 4
    assert got[("cascade_queue_wait_seconds_count", ())] == 2
    assert got[("cascade_request_seconds_count", (("status", "200"),))] == 1


def test_deadlines_met_missed_and_the_predictions_error() -> None:
    registry = CollectorRegistry()
    m = ServingMetrics(registry)
    m.deadline(200, 0.05, 0.1, 0.04)  # in time; measured 1.25x the prediction
    m.deadline(200, 0.2, 0.1, None)  # late; nothing was predicted
    m.deadline(400, 0.01, 0.1, 0.01)  # not an answer: neither
    m.deadline(200, 0.01, None, None)  # no deadline: neither
    got = samples(registry)
    assert got[("cascade_goodput_total", ())] == 1 and got[("cascade_late_answers_total", ())] == 1
    assert got[("cascade_admission_latency_ratio_count", ())] == 1
    assert got[("cascade_admission_latency_ratio_sum", ())] == pytest.approx(1.25)
    assert got[("cascade_admission_latency_ratio_bucket", (("le", "1.1"),))] == 0
    assert got[("cascade_admission_latency_ratio_bucket", (("le", "1.25"),))] == 1
    assert reason_of(429) == "deadline"


def test_the_metrics_folder_must_come_before_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    assert "prometheus_client" in sys.modules  # imported by this test module: too late to share a folder
    with pytest.raises(RuntimeError, match="imported before the metrics folder was set"):
        enable_multiprocess()
