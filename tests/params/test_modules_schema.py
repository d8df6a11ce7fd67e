"""``pipeline.params.modules_schema`` on its own: the modules section checked against whatever train
keys and rules it is given (tests/params/test_schema.py checks it through the real schema)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pipeline.params.keys import Int
from pipeline.params.modules_schema import check_modules, module_after

TRAIN_KEYS = {"epochs": Int(ge=1, default=4), "warmup": Int(ge=0, default=0)}


def _rules(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if v["warmup"] >= v["epochs"]:
        yield "warmup", f"must be < epochs ({v['epochs']}), got {v['warmup']}"


def _module(k: int, **train: Any) -> dict[str, Any]:
    return {"after": module_after(k), "spec": {"kind": "fixed", "channels": 8}, "train": train}


def check(modules: Any, levels: int | None = 3, **params: Any) -> list[str]:
    return check_modules(modules, "modules", params, train_keys=TRAIN_KEYS, train_rules=_rules, levels=levels)


def test_valid_modules_have_no_problem() -> None:
    assert check({"m1": _module(1), "m2": _module(2, epochs=6)}) == []


def test_a_rule_broken_is_named_where_it_can_be_mended() -> None:
    # the override itself breaks it: the module's key
    assert check({"m1": _module(1, warmup=5)}) == ["modules.m1.train.warmup must be < epochs (4), got 5"]
    # the common section's value breaks it under one module's override: the common key, for that module
    assert check({"m1": _module(1), "m2": _module(2, epochs=2)}, train={"warmup": 2}) == [
        "train.warmup must be < epochs (2), got 2 (for module m2, with its modules.m2.train overrides)"]


def test_the_given_train_keys_are_what_an_override_is_checked_against() -> None:
    (problem,) = check({"m1": _module(1, lr=0.1)})
    assert "modules.m1.train" in problem and "lr" in problem


def test_levels_must_cover_the_modules_and_names_run_in_order() -> None:
    assert any("grade.levels" in p for p in check({"m1": _module(1), "m2": _module(2)}, levels=1))
    assert check({"m1": _module(1), "m2": _module(2)}, levels=None) == []
    assert any("m1..mK in order" in p for p in check({"m2": _module(2)}))
