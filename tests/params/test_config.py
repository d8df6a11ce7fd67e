import pytest

from pipeline.models.config import ModelConfig
from pipeline.params.config import ConfigError, DataConfig, GradeConfig, deep_merge, load_params

PARAMS = load_params("params.yaml")


def test_default_params_load():
    assert DataConfig.from_params(PARAMS).source == "fashion-mnist"
    assert GradeConfig.from_params(PARAMS).levels == 3
    model = ModelConfig.from_params(PARAMS)
    # docs/BRIEF.md section 1: at least one module of the default cascade is a supernet.
    assert model.names == ("m1", "m2", "m3") and any(s.kind == "supernet" for s in model.specs)


@pytest.mark.parametrize("override,message", [
    ({"grade": {"curriculum": "reverse"}}, "grade.curriculum must be one of"),
    ({"grade": {"folds": 1}}, "grade.folds must be an int in 2..20, got 1"),
    ({"data": {"image_size": "big"}}, "data.image_size must be 'auto' or an int in 4..512, got 'big'"),
    ({"data": {"max_train": 3}}, "data.max_train must be null or an int >= 20, got 3"),
])
def test_bad_values_name_their_key(override, message):
    params = deep_merge(PARAMS, override)
    build = GradeConfig.from_params if "grade" in override else DataConfig.from_params
    with pytest.raises(ConfigError, match=message):
        build(params)


@pytest.mark.parametrize("override", [
    {"grade": {"folds": 1, "levels": 0}}, {"data": {"image_size": 2, "channels": 2}},
    {"validate": {"pixel_mean_min": 200, "pixel_mean_max": 100}}, {"profile": {"batch_sizes": [64]}},
    {"compute": {"device": "tpu"}}, {"register": {"acc_tolerance": 2}}, {"baselines": {"epochs": 0}},
])
def test_typed_configs_are_checked_by_the_schema_alone(override):
    """Every typed config reports exactly the schema's problems (every one, not only the first): the
    key is validated in one place, pipeline.params.schema."""
    from pipeline.device import ComputeConfig
    from pipeline.params.config import ProfileConfig, ValidateConfig
    from pipeline.params.schema import params_problems
    from pipeline.registry.register import RegisterConfig
    from pipeline.train.baselines import BaselineConfig

    params = deep_merge(PARAMS, override)
    expected = params_problems(params)
    assert expected
    build = {"grade": GradeConfig.from_params, "data": DataConfig.from_params,
             "validate": ValidateConfig.from_params, "profile": ProfileConfig.from_params,
             "compute": ComputeConfig.from_params, "register": RegisterConfig.from_params,
             "baselines": lambda p: BaselineConfig.from_dict(p["baselines"])}[next(iter(override))]
    with pytest.raises(ConfigError) as raised:
        build(params)
    assert list(raised.value.problems) == expected


def test_typed_configs_keep_their_types():
    from pipeline.params.config import ProfileConfig, ValidateConfig

    profile = ProfileConfig.from_params(deep_merge(PARAMS, {"profile": {"batch_sizes": [1, 8]}}))
    assert profile.batch_sizes == (1, 8)
    validate = ValidateConfig.from_params(deep_merge(PARAMS, {"validate": {"pixel_mean_min": 1}}))
    assert validate.pixel_mean_min == 1.0 and isinstance(validate.pixel_mean_min, float)


def test_bad_module_spec_names_the_module():
    params = deep_merge(PARAMS, {"modules": {"m2": {"spec": {"kind": "supernet", "channels": 8, "ops": ["conv7"],
                                                              "default_op": "conv7"}}}})
    with pytest.raises(ConfigError, match="modules.m2.spec"):
        ModelConfig.from_params(params)


def test_modules_must_be_in_order():
    params = dict(PARAMS)
    params["modules"] = {"m2": PARAMS["modules"]["m2"], "m1": PARAMS["modules"]["m1"]}
    with pytest.raises(ConfigError, match="m1..mK"):
        ModelConfig.from_params(params)


def test_deep_merge_does_not_mutate():
    base = {"a": {"b": 1, "c": 2}}
    merged = deep_merge(base, {"a": {"b": 5}})
    assert merged == {"a": {"b": 5, "c": 2}} and base == {"a": {"b": 1, "c": 2}}


def test_load_checked_params_checks_the_whole_file(tmp_path):
    from pipeline.params.config import check_params, load_checked_params

    assert load_checked_params("params.yaml") == PARAMS
    check_params(deep_merge(PARAMS, load_params("profiles/tiny.yaml")))
    bad = tmp_path / "p.yaml"
    bad.write_text("seed: 0\ndata: {source: digits, image_size: 16, val_fraction: 0.2, val_fraktion: 0.1}\n")
    suggestion = r"data\.val_fraktion is not a known key \(did you mean data\.val_fraction\?\)"
    with pytest.raises(ConfigError, match=suggestion):
        load_checked_params(bad, partial=True)
    with pytest.raises(ConfigError, match="register is missing"):
        load_checked_params(bad)


def test_load_params_alone_does_not_check():
    # profiles/tiny.yaml is a partial overlay: loading it must not demand every section
    assert load_params("profiles/tiny.yaml")["data"]["source"] == "digits"


def test_a_repeated_key_is_refused_with_both_lines(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("seed: 0\ntrain:\n  epochs: 3\n  lr: 0.1\n  epochs: 5\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'epochs' \(first on line 3\)"):
        load_params(path)


def test_a_batch_no_machine_can_hold_is_refused_up_front():
    import copy

    from pipeline.params.schema import check_params

    params = copy.deepcopy(PARAMS)
    params["train"]["batch_size"] = 10**12
    with pytest.raises(ConfigError, match=r"train\.batch_size"):
        check_params(params)


def test_typed_config_defaults_are_the_schemas() -> None:
    """TrainConfig and BaselineConfig keep dataclass defaults (for direct construction in code and tests);
    they must be the schema's, which params.yaml's absent keys get, so the two cannot drift apart."""
    import dataclasses

    from pipeline.params.keys import NO_DEFAULT
    from pipeline.params.schema import SCHEMA
    from pipeline.train.baselines import BaselineConfig
    from pipeline.train.config import TrainConfig

    for cls, name in ((TrainConfig, "train"), (BaselineConfig, "baselines")):
        keys = SCHEMA[name].keys
        for f in dataclasses.fields(cls):
            assert f.name in keys, f"{cls.__name__}.{f.name} is not a key of the schema's {name} section"
            if f.default is dataclasses.MISSING or keys[f.name].default is NO_DEFAULT:
                continue
            assert f.default == keys[f.name].default, (cls.__name__, f.name, f.default, keys[f.name].default)
