"""bench/search_methods.py's pooling of raw counts across runs (the searches themselves are a script)."""

from __future__ import annotations

import json

import pytest

from bench.search_methods import pool_runs


def test_pool_runs_pools_counts_and_counts_misses_as_the_budget(tmp_path) -> None:  # noqa: ANN001
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"settings": {"budget": 100}, "hits": {
        "bench": {"ours, plain pick": [10, 20], "new": [5, None]}}}))
    b.write_text(json.dumps({"settings": {"budget": 50}, "hits": {
        "bench": {"ours, plain pick": [30], "new": [15]}, "other": {"new": [7]}}}))
    rows = {(r["benchmark"], r["method"]): r for r in pool_runs([a, b])}
    plain, new = rows[("bench", "ours, plain pick")], rows[("bench", "new")]
    assert plain["runs"] == 3 and plain["median"] == 20 and plain["median_vs_reference"] == 1.0
    assert new["runs"] == 3 and new["median"] == 15 and new["mean"] == pytest.approx(40.0)  # 5, 100, 15
    assert new["median_vs_reference"] == pytest.approx(0.75)
    assert rows[("other", "new")]["median_vs_reference"] is None  # no reference runs there
