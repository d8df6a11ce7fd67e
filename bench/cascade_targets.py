"""Report the cascade's figures against the targets, from the evaluate stage's side-by-side run.

    dvc repro evaluate && python -m bench.cascade_targets [--metrics metrics/evaluate.json]

`evaluate` measures the cascade and every baseline in one process on the test split (accuracy,
average MACs, batch-1 latency and batch-256 throughput of the cascade and of the largest static
subnet, timed back to back), so ratios are not skewed by machine load between runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.evaluation.figures import comparison_table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metrics", type=Path, default=Path("metrics/evaluate.json"))
    args = p.parse_args(argv)
    m = json.loads(args.metrics.read_text())
    c, orc, ts = m["cascade"], m["oracle"], m["static_selection"]
    big, small = m["largest_candidate_static"], m["smallest_candidate_static"]
    v, t = m["vs_largest_candidate"], m["timing"]
    print(comparison_table(m))  # the cascade, its baselines and targets, as evaluate printed them
    rows = [
        ("cascade's paths, no exits (largest routing candidate)", big["accuracy"], big["mean_macs"]),
        ("cascade's paths, no exits (smallest routing candidate)", small["accuracy"], small["mean_macs"]),
        ("default paths, no exits", m["default_static"]["accuracy"], m["default_static"]["mean_macs"]),
        ("largest path of the whole space, no exits", m["space_largest_static"]["accuracy"],
         m["space_largest_static"]["mean_macs"]),
        ("smallest path of the whole space, no exits", m["space_smallest_static"]["accuracy"],
         m["space_smallest_static"]["mean_macs"]),
        ("oracle exit (lower bound on cost)", orc["accuracy"], orc["mean_macs"]),
    ] + [(f"module {r['module']} candidate {r['path']} as an exit", r["accuracy"], r["macs"])
         for r in m.get("candidate_exits", [])]
    print()
    for name, acc, macs in rows:
        print(f"{name:60s} {100 * acc:8.2f}% {macs:12,.0f}")
    print(f"\nexit shares {c['exit_share']}; thresholds {[round(x, 4) for x in c['thresholds']]}")
    print(f"cascade: {t['cascade']['latency_ms_b1_median']:.3f} ms/image at batch 1, "
          f"{t['cascade']['throughput_b256']:.0f} images/s at batch 256")
    print(f"its paths without exits: {t['largest_candidate_static']['latency_ms_b1_median']:.3f} ms/image at "
          f"batch 1, {t['largest_candidate_static']['throughput_b256']:.0f} images/s at batch 256")
    checks = [
        ("cascade accuracy >= 93.0%", c["accuracy"] >= 0.93, f"{100 * c['accuracy']:.2f}%"),
        ("within 0.3 points of its paths without exits", v["accuracy_gap_points"] <= 0.3,
         f"gap {v['accuracy_gap_points']:+.2f} points"),
        ("<= 30% of its paths' MACs without exits", v["macs_share"] <= 0.30, f"{100 * v['macs_share']:.1f}%"),
        ("batch-256 speed-up >= 0.8 x MACs ratio", v["speedup_over_macs_ratio"] >= 0.8,
         f"{v['throughput_speedup_b256']:.2f}x vs {v['macs_ratio']:.2f}x ({v['speedup_over_macs_ratio']:.2f})"),
        # a tie (the predictor unused: the same model) is not a win; evaluate's routing target is stricter
        ("predictor routing beats static selection",
         (c["accuracy"], -c["mean_macs"]) != (ts["accuracy"], -ts["mean_macs"])
         and c["accuracy"] >= ts["accuracy"] and c["mean_macs"] <= ts["mean_macs"],
         f"{100 * (c['accuracy'] - ts['accuracy']):+.2f} points, {c['mean_macs'] - ts['mean_macs']:+,.0f} MACs"),
    ]
    print()
    for name, ok, detail in checks:
        print(f"[{'met' if ok else 'MISSED'}] {name}: {detail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
