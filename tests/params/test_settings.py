"""Tests of pipeline.params.settings: ``section_problems`` (one section's schema check, with the train section's
cross-key rules and a caller's label), ``settings`` (a frozen, complete, schema-ordered view of a section)
and ``top_level`` (the top-level ``seed``)."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.params.keys import ParamsError
from pipeline.params.schema import SCHEMA
from pipeline.params.settings import section_problems, settings, top_level

TRAIN_OK = {"epochs": 4, "batch_size": 8, "lr": 0.1}


# --- section_problems ---------------------------------------------------------------------------------


def test_a_valid_section_has_no_problems() -> None:
    assert section_problems(TRAIN_OK, "train") == []
    assert section_problems({}, "select") == []


def test_every_problem_of_a_section_is_listed_with_its_dotted_key() -> None:
    problems = section_problems({"epochs": 0, "lr": -1, "bogus": 1}, "train")
    assert "train.bogus is not a known key (known: " in problems[0]
    assert "train.batch_size is missing (an int in 1..65536)" in problems
    assert "train.epochs must be an int >= 1, got 0" in problems
    assert "train.lr must be > 0, got -1" in problems
    assert len(problems) == 4


def test_train_checks_its_cross_key_rules_which_the_plain_schema_leaves_out() -> None:
    values = {**TRAIN_OK, "m": 16, "warmup_epochs": 4}
    problems = section_problems(values, "train")
    assert problems == ["train.warmup_epochs must be < epochs (4), got 4",
                        "train.m must be <= batch_size (8), got 16"]
    # Within the rules, the same section is clean.
    assert section_problems({**values, "m": 8, "warmup_epochs": 1}, "train") == []


def test_the_cross_key_rules_see_the_defaults() -> None:
    # m defaults to 4, more than a batch of 2.
    assert section_problems({**TRAIN_OK, "batch_size": 2}, "train") == [
        "train.m must be <= batch_size (2), got 4"]


def test_the_label_names_the_keys_as_the_caller_knows_them() -> None:
    problems = section_problems({**TRAIN_OK, "lr": 0}, "train", "modules.m2.train")
    assert problems == ["modules.m2.train.lr must be > 0, got 0"]


def test_a_section_that_is_not_a_mapping_is_one_problem() -> None:
    assert section_problems([1, 2], "select") == ["select must be a mapping, got [1, 2]"]


@pytest.mark.parametrize("name", ["seed", "modules"])
def test_only_plain_sections_can_be_checked(name: str) -> None:
    with pytest.raises(ValueError, match=f"params '{name}' is not a plain section"):
        section_problems({}, name)


# --- settings ----------------------------------------------------------------------------------------


def test_settings_fields_are_the_schema_keys_in_schema_order() -> None:
    s = settings({"train": TRAIN_OK}, "train")
    assert [f.name for f in dataclasses.fields(s)] == list(SCHEMA["train"].keys)
    assert type(s).__name__ == "TrainSettings"
    assert type(settings({"train": {**TRAIN_OK, "lr": 0.5}}, "train")) is type(s)  # one class per section
    assert (s.epochs, s.batch_size, s.lr, s.momentum, s.pick) == (4, 8, 0.1, 0.9, "entropy")


def test_given_values_override_the_defaults() -> None:
    s = settings({"calibrate": {"mode": "budget", "budget_macs": 1e6, "ensemble_decays": [0.0, 0.5]}},
                 "calibrate")
    assert (s.mode, s.budget_macs, s.ensemble_decays, s.grid) == ("budget", 1e6, [0.0, 0.5], 50)


@pytest.mark.parametrize("params", [{}, {"profile": None}, {"profile": {}}])
def test_an_absent_or_null_section_is_all_defaults(params: dict) -> None:
    s = settings(params, "profile")
    assert (s.repeats, s.batch_sizes) == (10, [1, 64])


def test_a_default_list_is_a_copy_so_a_caller_cannot_change_the_schema() -> None:
    s = settings({}, "profile")
    s.batch_sizes.append(256)
    assert SCHEMA["profile"].keys["batch_sizes"].default == [1, 64]
    assert settings({}, "profile").batch_sizes == [1, 64]


def test_settings_raise_every_problem_at_once() -> None:
    with pytest.raises(ParamsError) as info:
        settings({"train": {"lr": 0.1, "flip": "yes"}}, "train")
    assert info.value.problems == (
        "train.epochs is missing (an int >= 1)",
        "train.batch_size is missing (an int in 1..65536)",
        "train.flip must be true or false, got 'yes' (a string)",
    )


def test_settings_apply_the_section_rules() -> None:
    with pytest.raises(ParamsError, match="calibrate.budget_macs is required"):
        settings({"calibrate": {"mode": "budget"}}, "calibrate")
    with pytest.raises(ParamsError, match=r"train.m must be <= batch_size \(8\), got 9"):
        settings({"train": {**TRAIN_OK, "m": 9}}, "train")


def test_settings_of_a_non_mapping_section_is_a_params_error() -> None:
    with pytest.raises(ParamsError, match="select must be a mapping, got 'fast'"):
        settings({"select": "fast"}, "select")


def test_settings_of_a_top_level_key_is_refused() -> None:
    with pytest.raises(ValueError, match="is not a plain section"):
        settings({"seed": 3}, "seed")


# --- top_level ---------------------------------------------------------------------------------------


def test_top_level_seed_defaults_and_passes_valid_values() -> None:
    assert top_level({}, "seed") == 0
    assert top_level({"seed": 7}, "seed") == 7


@pytest.mark.parametrize("value,message", [
    (-1, "seed must be an int >= 0, got -1"),
    ("3", "seed must be an int >= 0, got '3' (a string: write the number without quotes)"),
    (True, "seed must be an int >= 0, got True (a bool)"),
    (None, "seed must be an int >= 0, got null"),
    (1.5, "seed must be an int >= 0, got 1.5"),
])
def test_top_level_seed_refuses_bad_values_with_the_reason(value: object, message: str) -> None:
    with pytest.raises(ParamsError) as info:
        top_level({"seed": value}, "seed")
    assert info.value.problems == (message,)


# --- typed fields -------------------------------------------------------------------------------------


def _fits(value: object, annotated: object) -> bool:
    import types
    import typing
    if isinstance(annotated, types.UnionType):
        return any(_fits(value, a) for a in typing.get_args(annotated))
    if annotated is type(None):
        return value is None
    if typing.get_origin(annotated) is list:
        (item,) = typing.get_args(annotated)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if annotated is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, annotated)  # type: ignore[arg-type]


def test_settings_fields_are_typed_from_the_schema_and_the_params_fit_them() -> None:
    from pipeline.params.config import load_params
    params = load_params()
    for name in ("data", "train", "select", "calibrate", "register", "baselines", "profile"):
        view = settings(params, name)
        for field in dataclasses.fields(view):
            assert field.type is not object and str(field.type) != "typing.Any", (name, field.name)
            assert _fits(getattr(view, field.name), field.type), (name, field.name, getattr(view, field.name))
    typed = {f.name: f.type for f in dataclasses.fields(settings(params, "calibrate"))}
    assert typed["budget_macs"] == float | None


# ------------------------------------------------------------------------ typed configs from the schema


def test_a_typed_config_has_the_schema_keys_as_fields_in_order_with_its_defaults() -> None:
    from pipeline.params.config import CalibrateConfig, SelectConfig
    from pipeline.params.schema import CALIBRATE, SELECT

    assert [f.name for f in dataclasses.fields(CalibrateConfig)] == list(CALIBRATE)
    assert [f.name for f in dataclasses.fields(SelectConfig)] == [*SELECT, "seed"]  # the extra field last
    defaults = {f.name: f.default for f in dataclasses.fields(CalibrateConfig)}
    assert defaults["grid"] == CALIBRATE["grid"].default and defaults["ensemble_decays"] == tuple(
        CALIBRATE["ensemble_decays"].default)
    assert CalibrateConfig.__name__ == "CalibrateConfig" and "thresholds" in (CalibrateConfig.__doc__ or "")


def test_a_typed_config_stores_numbers_as_floats_and_lists_as_tuples_and_gives_them_back() -> None:
    from pipeline.params.config import CalibrateConfig

    cfg = CalibrateConfig.from_params({"calibrate": {"delta": 0, "ensemble_decays": [0, 1]}})
    assert isinstance(cfg.delta, float) and cfg.ensemble_decays == (0, 1)
    assert hash(cfg)  # frozen and hashable
    assert cfg.section()["ensemble_decays"] == [0, 1] and list(cfg.section()) == list(SCHEMA["calibrate"].keys)


def test_a_checked_config_built_from_keywords_refuses_a_bad_value_naming_it() -> None:
    from pipeline.train.baselines import BaselineConfig
    from pipeline.train.config import TrainConfig

    with pytest.raises(ParamsError, match=r"BaselineConfig\.lr must be > 0"):
        BaselineConfig(lr=-1)
    with pytest.raises(ParamsError, match=r"TrainConfig\.schedule must be one of"):
        TrainConfig(epochs=1, batch_size=8, lr=0.1, schedule="linear")
    with pytest.raises(TypeError):  # keyword-only: a positional value cannot land in the wrong field
        TrainConfig(1, 8, 0.1)  # type: ignore[misc]
    with pytest.raises(TypeError, match="epochs"):  # a key the schema requires has no default
        TrainConfig(batch_size=8, lr=0.1)  # type: ignore[call-arg]


def test_the_baselines_recipe_is_the_modules_recipe() -> None:
    from pipeline.params.schema import BASELINES, TRAIN
    from pipeline.train.baselines import BaselineConfig

    recipe = set(BASELINES) - {"small_width", "large_width"}
    assert recipe <= set(TRAIN)
    assert all(BASELINES[k].type == TRAIN[k].type and BASELINES[k].ge == TRAIN[k].ge for k in recipe)
    cfg = BaselineConfig(epochs=3, lr=0.05, grad_clip=1.0)
    train = cfg.train_config(seed=7)
    assert {k: getattr(train, k) for k in recipe} == {k: getattr(cfg, k) for k in recipe}
    assert (train.lam, train.mu, train.seed) == (0.0, 0.0, 7)
