"""bench.archive.regularisers: variant parsing and the params each variant trains with (the runs are a bench)."""

from __future__ import annotations

import argparse

import pytest

from bench.archive.regularisers import parse_variant, variant_params


def test_parse_variant_reads_yaml_scalars() -> None:
    assert parse_variant("e=erase:0.5,flip:false") == ("e", {"erase": 0.5, "flip": False})
    for bad in ("erase:0.5", "e=", "e=erase"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_variant(bad)


def test_variant_params_overlays_one_module_only() -> None:
    params = {"train": {"epochs": 4}, "modules": {"m1": {"train": {"epochs": 12}}, "m2": {}}}
    out = variant_params(params, 2, {"erase": 0.5})
    assert out["modules"]["m2"]["train"] == {"erase": 0.5}
    assert out["modules"]["m1"] == {"train": {"epochs": 12}} and out["train"] == {"epochs": 4}
    assert params["modules"]["m2"] == {}  # the input is not changed
    assert variant_params(params, 1, {"erase": 0.25})["modules"]["m1"]["train"] == {"epochs": 12, "erase": 0.25}
