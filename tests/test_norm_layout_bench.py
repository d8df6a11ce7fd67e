"""bench/norm_layout.py: which nets carry odd-width norms, and a one-round run's record."""

from __future__ import annotations

import json

from bench.norm_layout import main, nets
from pipeline.device import odd_width_norms


def test_the_defaults_nets_have_no_odd_width_norm_and_the_quick_plain_cnns_do():
    odd = {name: [m.num_features for m in odd_width_norms([net])] for name, net, _, _ in nets("params.yaml",
                                                                                                "profiles/quick.yaml")}
    assert all(not widths for name, widths in odd.items() if name.startswith("default"))  # outputs unchanged
    assert odd["quick plain_small (w=4)"] == [4, 4] and odd["quick plain_large (w=12)"] == [12, 12]


def test_one_round_writes_a_row_per_net_with_both_timings(tmp_path):
    out = tmp_path / "norm_layout.json"
    assert main(["--rounds", "1", "--steps", "1", "--widths", "6", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 7 and rows[-1]["standard_norms"] == [6, 6]
    assert all(r["ms_per_step_standard"] > 0 and r["ms_per_step_all_channels_last"] > 0 for r in rows)
