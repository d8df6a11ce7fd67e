"""tests/tools/rerun_determinism.py's lock comparison (the two-run benchmark itself is a script)."""

from tests.tools.rerun_determinism import compare_locks, lock_outputs


def _lock(**outs):
    return {"stages": {stage: {"outs": [{"path": p, "md5": h} for p, h in items]} for stage, items in outs.items()}}


def test_lock_outputs_lists_every_stage_output():
    lock = _lock(a=[("x", "1"), ("metrics/a.json", "2")], b=[("y", "3")])
    assert lock_outputs(lock) == {("a", "x"): "1", ("a", "metrics/a.json"): "2", ("b", "y"): "3"}


def test_metrics_may_differ_other_outputs_may_not():
    a = _lock(s=[("models/x", "1"), ("metrics/s.json", "2"), ("plots/p", "3")])
    b = _lock(s=[("models/x", "1"), ("metrics/s.json", "9"), ("plots/p", "4")], t=[("z", "5")])
    result = compare_locks(a, b)
    assert result["equal"] == [("s", "models/x")]
    assert [d[0] for d in result["metrics_differ"]] == [("s", "metrics/s.json")]
    assert result["differ"] == [(("s", "plots/p"), "3", "4")]
    assert result["only_one"] == [("t", "z")]
