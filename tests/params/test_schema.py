"""The up-front params check (pipeline.params.schema): every key, strict types, ranges, unknown keys with
a suggestion, every problem at once, and the stages running it before anything else."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.params.config import ConfigError, deep_merge, load_params
from pipeline.params.schema import SCHEMA, ParamsError, check_params, params_problems

ROOT = Path(__file__).resolve().parents[2]
PARAMS = load_params(ROOT / "params.yaml")
TINY = deep_merge(PARAMS, load_params(ROOT / "profiles" / "tiny.yaml"))


def problems_with(override: dict, base: dict = PARAMS) -> list[str]:
    return params_problems(deep_merge(base, override))


def the_problem(override: dict) -> str:
    found = problems_with(override)
    assert len(found) == 1, found
    return found[0]


# ------------------------------------------------------------------------------- the shipped params


@pytest.mark.parametrize("params", [PARAMS, TINY], ids=["params.yaml", "tiny"])
def test_shipped_params_pass(params):
    check_params(params)


def test_every_test_variant_passes():
    # the e2e tests' edits of the tiny params (tests/e2e)
    for override in ({"grade": {"folds": 4}}, {"validate": {"pixel_mean_min": 200.0}},
                     {"modules": {"m3": {"train": {"epochs": 1}}}}):
        assert problems_with(override, TINY) == [], override


def test_optional_keys_and_sections():
    assert problems_with({"data": {"max_pixels": 4096}}) == []
    assert problems_with({"calibrate": {"mode": "budget", "budget_macs": 1e6}}) == []
    optional = ("tracking", "model", "profile", "baselines", "seed")
    params = {k: v for k, v in PARAMS.items() if k not in optional}
    check_params(params)
    check_params({**PARAMS, "baselines": None, "profile": None})


# ------------------------------------------------------------------------------------ strict types


@pytest.mark.parametrize("override,key,got", [
    ({"train": {"epochs": "3"}}, "train.epochs", "'3'"),
    ({"search": {"samples": "six"}}, "search.samples", "'six'"),
    ({"calibrate": {"delta": "abc"}}, "calibrate.delta", "'abc'"),
    ({"search": {"samples": 2.5}}, "search.samples", "2.5"),
    ({"select": {"epochs": True}}, "select.epochs", "True"),
    ({"train": {"flip": "yes"}}, "train.flip", "'yes'"),
    ({"train": {"flip": 1}}, "train.flip", "1"),
    ({"grade": {"levels": 3.0}}, "grade.levels", "3.0"),
    ({"data": {"channels": True}}, "data.channels", "True"),
    ({"seed": "0"}, "seed", "'0'"),
    ({"tracking": {"experiment": 5}}, "tracking.experiment", "5"),
    ({"profile": {"batch_sizes": [1, "64"]}}, "profile.batch_sizes", "[1, '64']"),
    ({"register": {"acc_tolerance": float("nan")}}, "register.acc_tolerance", "nan"),
])
def test_wrong_type_names_key_and_value(override, key, got):
    problem = the_problem(override)
    assert problem.startswith(f"{key} must be ") and f"got {got}" in problem, problem


def test_string_number_says_to_drop_the_quotes():
    assert "without quotes" in the_problem({"train": {"epochs": "3"}})
    assert "without quotes" not in the_problem({"search": {"samples": "six"}})


def test_int_is_a_number():
    assert problems_with({"train": {"lr": 1}, "select": {"delta": 0}}) == []


# ------------------------------------------------------------------------------------------- ranges


@pytest.mark.parametrize("override,expected", [
    ({"train": {"epochs": 0}}, "train.epochs must be an int >= 1, got 0"),
    ({"data": {"val_fraction": 1.5}}, "data.val_fraction must be strictly between 0 and 1, got 1.5"),
    ({"data": {"route_fraction": 0}}, "data.route_fraction must be strictly between 0 and 1, got 0"),
    ({"data": {"image_size": 2}}, "data.image_size must be 'auto' or an int in 4..512, got 2"),
    ({"data": {"channels": 2}}, "data.channels must be 'auto' or one of 1, 3, got 2"),
    ({"data": {"max_train": 3}}, "data.max_train must be null or an int >= 20, got 3"),
    ({"data": {"max_pixels": 0}}, "data.max_pixels must be an int >= 1, got 0"),
    ({"calibrate": {"delta": 1.5}}, "calibrate.delta must be in [0, 1), got 1.5"),
    ({"calibrate": {"delta": -0.1}}, "calibrate.delta must be in [0, 1), got -0.1"),
    ({"train": {"lr": 0}}, "train.lr must be > 0, got 0"),
    ({"train": {"momentum": 1.0}}, "train.momentum must be in [0, 1), got 1.0"),
    ({"grade": {"folds": 1}}, "grade.folds must be an int in 2..20, got 1"),
    ({"select": {"max_macs_share": 0}}, "select.max_macs_share must be in (0, 1], got 0"),
    ({"seed": -1}, "seed must be an int >= 0, got -1"),
])
def test_out_of_range_names_key_and_value(override, expected):
    assert the_problem(override) == expected


@pytest.mark.parametrize("override,key", [
    ({"grade": {"curriculum": "reverse"}}, "grade.curriculum"),
    ({"select": {"mode": "oracle"}}, "select.mode"),
    ({"calibrate": {"reference": "worst"}}, "calibrate.reference"),
    ({"train": {"schedule": "linear"}}, "train.schedule"),
    ({"model": {"confidence": "entropy"}}, "model.confidence"),
    ({"data": {"source": "mnist"}}, "data.source"),
    ({"register": {"model_name": "a/b"}}, "register.model_name"),
])
def test_enums_and_patterns(override, key):
    assert the_problem(override).startswith(f"{key} must be ")


# -------------------------------------------------------------------------------- cross-key rules


@pytest.mark.parametrize("override,expected", [
    ({"validate": {"pixel_mean_min": 200.0, "pixel_mean_max": 100.0}}, "validate.pixel_mean_min must be <= "),
    ({"calibrate": {"mode": "budget"}}, "calibrate.budget_macs is required"),
    ({"profile": {"batch_sizes": [64]}}, "profile.batch_sizes must include 1"),
    ({"baselines": {"small_width": 16, "large_width": 8}}, "baselines.large_width must be >= small_width"),
    ({"grade": {"levels": 2}}, "grade.levels must be >= the number of modules (3)"),
    ({"modules": {"m3": {"train": {"epochs": 1, "warmup_epochs": 2}}}},
     "modules.m3.train.warmup_epochs must be < epochs (1), got 2"),
    ({"modules": {"m1": {"train": {"m": 500}}}}, "modules.m1.train.m must be <= batch_size (128), got 500"),
    ({"train": {"distill": 0.5, "sandwich": False}}, "train.distill must be 0 unless sandwich is true"),
])
def test_cross_key_rules(override, expected):
    assert the_problem(override).startswith(expected)


def test_train_rule_on_the_merged_config_names_the_module():
    # train.warmup_epochs 7 is fine for m1/m2 (epochs 12) but not for an m3 given 6 epochs
    problem = the_problem({"train": {"warmup_epochs": 7}, "modules": {"m3": {"train": {"epochs": 6}}}})
    assert problem.startswith("train.warmup_epochs must be < epochs (6), got 7") and "module m3" in problem


# ------------------------------------------------------------------------------------ module specs


@pytest.mark.parametrize("spec,expected", [
    ({"kind": "fixed", "ops": ["conv3", "dw3"]}, "modules.m1.spec.ops is for supernet modules only"),
    ({"kind": "fixed", "default_op": "skip"}, "modules.m1.spec.default_op must be one of"),
    ({"kind": "fixd"}, "modules.m1.spec.kind must be one of 'fixed', 'supernet', got 'fixd'"),
    ({"channels": "16"}, "modules.m1.spec.channels must be an int >= 1, got '16'"),
    ({"stride": 3}, "modules.m1.spec.stride must be one of 1, 2, got 3"),
    ({"head": "mlp"}, "modules.m1.spec.head must be one of"),
    ({"head_gird": 4}, "modules.m1.spec.head_gird is not a known key (did you mean modules.m1.spec.head_gr"),
    ({"pools": 2}, "modules.m1.spec.pools must be <= layers (1): each pool precedes a layer, got 2"),
    ({"pools": "2"}, "modules.m1.spec.pools must be an int >= 0, got '2'"),
])
def test_fixed_module_spec(spec, expected):
    assert the_problem({"modules": {"m1": {"spec": spec}}}).startswith(expected)


@pytest.mark.parametrize("spec,expected", [
    ({"ops": ["conv3", "conv9"]}, "modules.m3.spec.ops must be a list of values from"),
    ({"ops": ["conv3", "conv3"], "default_op": "conv3"}, "modules.m3.spec.ops must be"),
    ({"default_op": "conv5"}, "modules.m3.spec.default_op must be one of ops"),
    ({"default_op": "skip"}, "modules.m3.spec.default_op must be one of"),
    ({"layers": 0}, "modules.m3.spec.layers must be >= 1 for a supernet module, got 0"),
])
def test_supernet_module_spec(spec, expected):
    assert the_problem({"modules": {"m3": {"spec": spec}}}).startswith(expected)


def test_supernet_needs_ops_and_missing_spec_keys():
    params = copy.deepcopy(PARAMS)
    del params["modules"]["m3"]["spec"]["ops"]
    del params["modules"]["m2"]["spec"]["channels"]
    found = params_problems(params)
    assert "modules.m3.spec.ops is missing (required for a supernet module)" in found
    assert any(p.startswith("modules.m2.spec.channels is missing") for p in found)


def test_modules_named_in_order_and_module_keys():
    params = copy.deepcopy(PARAMS)
    params["modules"] = {"m2": PARAMS["modules"]["m2"], "m1": PARAMS["modules"]["m1"]}
    assert any("modules must be named m1..mK in order" in p for p in params_problems(params))
    assert the_problem({"modules": {"m1": {"trian": {"epochs": 2}}}}) == \
        "modules.m1.trian is not a known key (did you mean modules.m1.train?)"
    assert the_problem({"modules": {"m1": {"train": {"epoch": 2}}}}) == \
        "modules.m1.train.epoch is not a known key (did you mean modules.m1.train.epochs?)"
    assert the_problem({"modules": {"m1": {"train": {"epochs": "2"}}}}).startswith(
        "modules.m1.train.epochs must be an int >= 1, got '2'")


# ------------------------------------------------------------------------------ unknown and missing


def test_unknown_key_with_suggestion():
    assert the_problem({"data": {"val_fraktion": 0.1}}) == \
        "data.val_fraktion is not a known key (did you mean data.val_fraction?)"


def test_unknown_key_without_close_match_lists_known_keys():
    problem = the_problem({"search": {"zzz": 1}})
    assert problem.startswith("search.zzz is not a known key (known: samples, pareto_max")


def test_unknown_top_level_section():
    assert the_problem({"trian": {"epochs": 3}}) == "trian is not a known section (did you mean train?)"


def test_missing_required_key_and_section():
    params = copy.deepcopy(PARAMS)
    del params["data"]["image_size"]
    del params["register"]
    found = params_problems(params)
    assert "data.image_size is missing ('auto' or an int in 4..512)" in found
    assert "register is missing (a required section)" in found
    # a stage checks what is there; a missing section is left to the stage that reads it
    assert params_problems(params, partial=True) == ["data.image_size is missing ('auto' or an int in 4..512)"]


def test_section_not_a_mapping():
    assert the_problem({"select": [1, 2]}) == "select must be a mapping, got [1, 2]"
    assert params_problems([1]) and params_problems(None)


def test_several_problems_reported_together():
    bad = deep_merge(PARAMS, {"train": {"epochs": "3"}, "search": {"samples": 2.5}, "trian": {},
                              "data": {"val_fraktion": 0.1}, "select": {"epochs": 0}})
    with pytest.raises(ConfigError) as info:
        check_params(bad)
    assert isinstance(info.value, ParamsError) and len(info.value.problems) == 5
    message = str(info.value)
    assert message.startswith("params: 5 problems:")
    for key in ("train.epochs", "search.samples", "trian", "data.val_fraktion", "select.epochs"):
        assert f"- {key} " in message


def test_one_problem_is_one_line():
    with pytest.raises(ConfigError, match=r"^params: train\.epochs must be an int >= 1, got '3'"):
        check_params(deep_merge(PARAMS, {"train": {"epochs": "3"}}))


# ----------------------------------------------------------------------- schema vs the library


def test_schema_enums_match_the_library():
    """The two mirrors left (every other enumeration is written once, in pipeline.params.choices):
    the op names (the library maps each to a constructor) and io's held-out sets (io stands beside params)."""
    from pipeline import io
    from pipeline.models import ops
    from pipeline.params.schema import HELD_OUT, OPS

    assert set(OPS) == set(ops.OPS) and HELD_OUT == io.HELD_OUT


def test_schema_keys_match_the_typed_configs():
    from pipeline.models.modules import ModuleSpec
    from pipeline.params.config import DataConfig
    from pipeline.params.schema import BASELINES, DATA, MODULE_SPEC, TRAIN
    from pipeline.train.baselines import BaselineConfig
    from pipeline.train.config import TrainConfig

    names = lambda cls: {f.name for f in dataclasses.fields(cls)}  # noqa: E731
    assert set(TRAIN) == names(TrainConfig)
    assert set(BASELINES) == names(BaselineConfig)
    assert set(MODULE_SPEC) == names(ModuleSpec)
    assert names(DataConfig) - {"seed"} <= set(DATA)
    assert set(PARAMS) <= set(SCHEMA)


# ------------------------------------------------------------------------------------ the stages


def write(tmp_path: Path, override: dict) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(deep_merge(PARAMS, override)))
    return path


def test_bad_key_elsewhere_fails_ingest_first(tmp_path, capsys, monkeypatch):
    """A bad train.epochs stops the very first stage, before it reads or writes anything."""
    from stages import ingest

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    params = write(tmp_path, {"train": {"epochs": "3"}, "data": {"source": "idx:/nonexistent"}})
    out, metrics = tmp_path / "prepared", tmp_path / "m.json"
    assert ingest.main(["--params", str(params), "--out", str(out), "--metrics", str(metrics)]) == 3
    err = capsys.readouterr().err
    assert "train.epochs must be an int >= 1, got '3'" in err and "nonexistent" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_stage_process_with_bad_params_exits_fast_naming_the_key(tmp_path):
    params = write(tmp_path, {"select": {"epochs": "many"}, "data": {"val_fraktion": 0.1}})
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}", "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "stages.select", "--params", str(params), "--module", "2",
         "--data", str(tmp_path / "data"), "--profile", str(tmp_path / "profile.json"),
         "--models", str(tmp_path / "models"), "--metrics", str(tmp_path / "select.json")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - start
    assert result.returncode == 3, result.stderr
    assert "select.epochs must be an int >= 1, got 'many'" in result.stderr
    assert "data.val_fraktion is not a known key (did you mean data.val_fraction?)" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
    assert elapsed < 120  # imports only (torch); no data is read


def test_check_params_cli(tmp_path, capsys):
    from pipeline.check_params import main

    assert main(["--params", str(ROOT / "params.yaml")]) == 0
    tiny = ["--overlay", str(ROOT / "profiles" / "tiny.yaml")]
    assert main(["--params", str(ROOT / "params.yaml"), *tiny]) == 0
    capsys.readouterr()
    assert main(["--params", str(write(tmp_path, {"trian": {}, "search": {"samples": 2.5}}))]) == 3
    err = capsys.readouterr().err
    assert "2 problems" in err and "trian is not a known section (did you mean train?)" in err
    assert "search.samples must be an int >= 1, got 2.5" in err
    params = load_params(ROOT / "params.yaml")
    params["data"]["source"] = f"imagefolder:{tmp_path / 'no-such-folder'}"
    assert main(["--params", str(write(tmp_path, params))]) == 3  # a folder that is not there: said before a run
    assert "no-such-folder does not exist" in capsys.readouterr().err


def test_settings_give_every_key_of_a_section_with_the_schema_defaults() -> None:
    from pipeline.params.settings import settings

    s = settings({"select": {"mode": "testset", "pool": 2}}, "select")
    assert (s.mode, s.pool, s.hidden, s.scoring, s.delta) == ("testset", 2, 16, "label", 0.003)
    with pytest.raises(AttributeError):
        s.mode = "predictor"  # frozen: read, never changed
    assert settings({}, "calibrate").ensemble_decays == [0.0, 0.25, 0.5, 1.0]
    with pytest.raises(ParamsError, match="register.model_name is missing"):
        settings({"register": {}}, "register")


def test_search_spread_of_one_is_refused_up_front() -> None:
    problems = params_problems({"search": {"spread": 1}}, partial=True)
    assert problems == ["search.spread must be 0 or at least 2 (the cheapest and the largest path)"]
