"""Each default is written once, in the schema, and it is what ``params.yaml`` ships: a params file
without a key gets the rule the README calls the default (docs/DESIGN.md "Stages and workflows")."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from pipeline.params.config import CalibrateConfig, GradeConfig, SearchConfig, SelectConfig
from pipeline.params.keys import NO_DEFAULT, Key, Section
from pipeline.params.schema import SCHEMA
from pipeline.params.settings import schema_default
from tests.tools.tiny_repo import ROOT

SHIPPED = yaml.safe_load((ROOT / "params.yaml").read_text())


def shipped_keys() -> list[tuple[str, str | None]]:
    """(section, key) for every key params.yaml sets that the schema gives a default; (name, None) for a
    top-level key. Required keys have no default: the file must set them."""
    out: list[tuple[str, str | None]] = []
    for name, spec in SCHEMA.items():
        if isinstance(spec, Key) and name in SHIPPED and spec.default is not NO_DEFAULT:
            out.append((name, None))
        elif isinstance(spec, Section):
            out += [(name, key) for key, k in spec.keys.items()
                    if key in (SHIPPED.get(name) or {}) and k.default is not NO_DEFAULT]
    return out


def test_the_check_covers_the_sections_whose_defaults_once_disagreed() -> None:
    covered = set(shipped_keys())
    for key in ("held_out", "bound_z", "ensemble_decays", "min_reach"):
        assert ("calibrate", key) in covered
    assert ("seed", None) in covered and ("train", "sandwich") in covered and len(covered) > 80


@pytest.mark.parametrize(("name", "key"), shipped_keys(), ids=lambda v: str(v))
def test_the_schema_default_is_what_params_yaml_ships(name: str, key: str | None) -> None:
    if key is None:
        assert SCHEMA[name].default == SHIPPED[name]  # type: ignore[union-attr]
        return
    default = schema_default(name, key)
    shipped = SHIPPED[name][key]
    assert default == shipped and type(default) is type(shipped), (
        f"{name}.{key}: the schema's default {default!r} is not params.yaml's {shipped!r}")


def test_a_section_left_out_gets_the_shipped_calibration_rule() -> None:
    cfg = CalibrateConfig.from_params({})
    assert (cfg.held_out, cfg.bound_z, cfg.ensemble_decays) == ("pooled", 1.0, (0.0, 0.25, 0.5, 1.0))
    assert cfg == CalibrateConfig.from_params({"calibrate": SHIPPED["calibrate"]})
    assert SearchConfig.from_params({"seed": 4}).section() == {**SHIPPED["search"], "spread": 0}
    assert SelectConfig.from_params({}).section() == {**SHIPPED["select"], "scoring": "label", "pool": 1}


def test_typed_config_fields_default_to_the_schema() -> None:
    fields = {f.name: f for f in dataclasses.fields(GradeConfig)}
    assert fields["level_weight"].default == schema_default("grade", "level_weight")


def test_a_key_without_a_default_says_so() -> None:
    with pytest.raises(ValueError, match="register.model_name has no default"):
        schema_default("register", "model_name")
