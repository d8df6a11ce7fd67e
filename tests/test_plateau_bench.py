"""bench.plateau's variants: one baselines key or the training seed changed, a bad one refused (the run
itself: tests/e2e/test_plateau_bench.py)."""

from __future__ import annotations

import pytest

from bench.plateau import variant_config
from pipeline.train.baselines import BaselineConfig


def test_variants_change_one_key_or_the_seed() -> None:
    cfg = BaselineConfig()
    assert variant_config(cfg, 5, "committed") == (cfg, 5)
    assert variant_config(cfg, 5, "seed=9") == (cfg, 9)
    changed, seed = variant_config(cfg, 5, "warmup_epochs=3")
    assert changed.warmup_epochs == 3.0 and isinstance(changed.warmup_epochs, float) and seed == 5
    for bad in ("no_such_key=1", "lr", "committed=1"):
        with pytest.raises(SystemExit, match="variant"):
            variant_config(cfg, 5, bad)

