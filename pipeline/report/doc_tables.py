"""The docs' headline tables, written from the committed JSON they report.

    python -m pipeline.report.doc_tables           # rewrite every generated block in README.md and docs/
    python -m pipeline.report.doc_tables --check   # exit 1 naming each block whose text differs from its JSON

A generated block sits between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->`` lines; only
the text between them is rewritten, so prose around a table stays the author's. Each table names the
file its figures come from, so a figure in the docs is always traceable to data and cannot go stale
without ``tests/report/test_doc_tables.py`` failing (docs/DESIGN.md "Figures are data").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EVALUATE = Path("metrics") / "evaluate.json"
ANCHORS = Path("docs") / "results" / "anchors" / "fashion_mnist.json"
ARCHITECT = (("digits", Path("docs") / "results" / "architect" / "digits_seed0.json"),
             ("digits", Path("docs") / "results" / "architect" / "digits_seed0_m4.json"),
             ("digits, ceiling 0.5x", Path("docs") / "results" / "architect" / "digits_seed0_m4_ceiling.json"),
             ("Fashion-MNIST", Path("docs") / "results" / "architect" / "fmnist_seed0_m4.json"))
CEILING = 0.5  # the architect table's second choice: under this share of plain_large's MACs


def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def mmacs(x: float) -> str:
    return f"{x / 1e6:.2f} M"


def _read(root: Path, rel: Path) -> dict[str, Any]:
    path = root / rel
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DocTablesError(f"{rel}: not found (the table reports it)") from None
    except json.JSONDecodeError as exc:
        raise DocTablesError(f"{rel}: not valid JSON ({exc})") from None


class DocTablesError(ValueError):
    """A block's markers or its data are missing or malformed: names the file."""


def _shares(shares: list[float]) -> str:
    return ", ".join(f"{100 * s:.1f}% at exit {k}" for k, s in enumerate(shares, start=1))


def _best_exit(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    return max(evaluation["each_exit_alone"], key=lambda r: (r["accuracy"], -r["mean_macs"]))


def default_results(root: Path) -> str:
    """The shipped Fashion-MNIST model against its run's own baselines (README "Results")."""
    ev = _read(root, EVALUATE)
    cascade, static, base = ev["cascade"], ev["static_selection"], ev["baselines"]
    small, large, two = base["plain_small"], base["plain_large"], base["two_cnn_cascade"]
    first, best = ev["each_exit_alone"][0], _best_exit(ev)
    budget = ev["epoch_budget"]
    same = static["accuracy"] == cascade["accuracy"] and static["mean_macs"] == cascade["mean_macs"]
    rows = [
        ("model (seed 0, test split)", "accuracy", "mean MACs"),
        (f"**the cascade** ({len(cascade['exit_share'])} exits; {_shares(cascade['exit_share'])})",
         f"**{pct(cascade['accuracy'])}** (SE {100 * ev['shipped']['se']:.2f})", f"**{mmacs(cascade['mean_macs'])}**"),
        ("its static twin (claim-8 static paths, no predictor)" + (": the same model" if same else ""),
         pct(static["accuracy"]), mmacs(static["mean_macs"])),
        ("two plain CNNs chained by a calibrated threshold", pct(two["accuracy"]), mmacs(two["mean_macs"])),
        (f"plain large CNN / plain small CNN ({budget['baselines']} epochs; the modules train "
         f"{'/'.join(str(e) for e in sorted(set(budget['modules'])))})",
         f"{pct(large['accuracy'])} / {pct(small['accuracy'])}",
         f"{mmacs(large['mean_macs'])} / {mmacs(small['mean_macs'])}"),
        (f"exit 1 alone / exit {best['exit']} alone (the best single exit)",
         f"{pct(first['accuracy'])} / {pct(best['accuracy'])}",
         f"{mmacs(first['mean_macs'])} / {mmacs(best['mean_macs'])}"),
    ]
    source = f"From `{EVALUATE.as_posix()}` (its `dvc.lock` entry names the code and params that wrote it)."
    return f"{_table(rows)}\n\n{source}"


def default_budget_curve(root: Path) -> str:
    """The cascade's budget curve, thresholds fitted on held-out images at each budget, read on test."""
    ev = _read(root, EVALUATE)
    curve = sorted(ev["budget_curves"]["cascade"], key=lambda r: r["mean_macs"])
    rows = [("budget curve point (fitted on held-out images)", "test accuracy", "mean MACs")]
    rows += [(f"point {i}", pct(r["accuracy"]), mmacs(r["mean_macs"])) for i, r in enumerate(curve, start=1)]
    return _table(rows) + f"\n\nFrom `{EVALUATE.as_posix()}` (`budget_curves.cascade`)."


def anchors_table(root: Path) -> str:
    """The field's small networks beside the committed cascade (docs/RESULTS.md "The field's small networks")."""
    anchors = _read(root, ANCHORS)["anchors"]
    ev = _read(root, EVALUATE)
    rows = [("model", "test accuracy (SE)", "MACs", "parameters", "epochs")]
    for a in sorted(anchors, key=lambda r: r["mean_macs"]):
        rows.append((f"`{a['name']}`", f"{pct(a['accuracy'])} ({100 * a['se']:.2f})", mmacs(a["mean_macs"]),
                     f"{round(a['params'] / 1e3):,} k", str(a["epochs"])))
    small, large = ev["baselines"]["plain_small"], ev["baselines"]["plain_large"]
    rows.append(("`plain_small` / `plain_large`", f"{pct(small['accuracy'])} / {pct(large['accuracy'])}",
                 f"{mmacs(small['mean_macs'])} / {mmacs(large['mean_macs'])}", "",
                 str(ev["epoch_budget"]["baselines"])))
    exits = ev["each_exit_alone"]
    rows.append((f"cascade exit {' / '.join(str(r['exit']) for r in exits)} alone",
                 " / ".join(pct(r["accuracy"]) for r in exits), " / ".join(mmacs(r["mean_macs"]) for r in exits),
                 "", "/".join(str(e) for e in ev["epoch_budget"]["modules"])))
    shipped = ev["shipped"]
    rows.append(("**cascade (shipped)**", f"**{pct(shipped['accuracy'])} ({100 * shipped['se']:.2f})**",
                 f"**{mmacs(shipped['mean_macs'])}**", "", ""))
    return _table(rows) + (f"\n\nFrom `{ANCHORS.as_posix()}` (the anchors) and `{EVALUATE.as_posix()}` "
                           "(the cascade and the plain CNNs).")


def _under_ceiling(result: dict[str, Any], run: dict[str, Any]) -> str:
    """The one-SE choice among the run's scored shapes under ``CEILING`` x plain_large's MACs (bench JSONs
    that predate ``plain_large_macs``: a dash)."""
    large, n = result.get("plain_large_macs"), result.get("held_out_images")
    under = [s for s in run["scored"] if large and n and s["mean_macs"] <= CEILING * large]
    if not under:
        return "-"
    best = max(under, key=lambda s: (s["accuracy"], -s["mean_macs"]))
    se = (best["accuracy"] * (1 - best["accuracy"]) / n) ** 0.5
    pick = min((s for s in under if s["accuracy"] >= best["accuracy"] - se), key=lambda s: s["mean_macs"])
    return f"{pct(pick['accuracy'])} at {mmacs(pick['mean_macs'])}"


def architect_table(root: Path) -> str:
    """bench.architect's runs: per data, shapes drawn a batch, sampler and searcher, the chosen shape, the
    choice under half of plain_large's MACs, and the best score found."""
    rows = [("data", "shapes drawn a batch", "weights trained with", "searched by", "chosen: held-out accuracy",
             "mean MACs", "exits alone", f"chosen under {CEILING:g}x plain_large", "best score after 2 / all",
             "train s")]
    for label, rel in ARCHITECT:
        result = _read(root, rel)
        data = f"{label}, {result['train_images']:,} images" if "train_images" in result else label
        for r in result["runs"]:
            chosen, best = r["chosen"], r["best_score"]
            widths = "/".join(str(x["width"]) for x in chosen["shapes"])
            rows.append((data, f"2 + {result['config']['m']}", r["sampler"], r["searcher"],
                         f"{pct(chosen['accuracy'])} (widths {widths})", mmacs(chosen["mean_macs"]),
                         " / ".join(pct(a) for a in chosen["exit_accuracy"]), _under_ceiling(result, r),
                         f"{best[min(1, len(best) - 1)]:.4f} / {best[-1]:.4f}", f"{r['train_seconds']:g}"))
    return f"{_table(rows)}\n\nFrom {', '.join(f'`{rel.as_posix()}`' for _, rel in ARCHITECT)}."


def _table(rows: list[tuple[str, ...]]) -> str:
    lines = [f"| {' | '.join(rows[0])} |", f"| {' | '.join('---' for _ in rows[0])} |"]
    lines += [f"| {' | '.join(row)} |" for row in rows[1:]]
    return "\n".join(lines)


@dataclass(frozen=True)
class Block:
    doc: Path  # relative to the repository root
    write: Callable[[Path], str]


BLOCKS: Mapping[str, Block] = {
    "readme-results": Block(Path("README.md"), default_results),
    "results-default": Block(Path("docs/RESULTS.md"), default_results),
    "results-budget-curve": Block(Path("docs/RESULTS.md"), default_budget_curve),
    "results-anchors": Block(Path("docs/RESULTS.md"), anchors_table),
    "results-architect": Block(Path("docs/RESULTS.md"), architect_table),
}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated:{re.escape(name)} -->)(.*?)(<!-- /generated:{re.escape(name)} -->)",
                      re.DOTALL)


def fill(text: str, name: str, body: str, doc: Path) -> str:
    """``text`` with block ``name``'s body replaced by ``body``; a DocTablesError when its markers are missing."""
    pattern = _pattern(name)
    if len(pattern.findall(text)) != 1:
        raise DocTablesError(f"{doc}: needs exactly one block <!-- generated:{name} --> ... "
                             f"<!-- /generated:{name} -->")
    return pattern.sub(lambda m: f"{m.group(1)}\n{body}\n{m.group(3)}", text)


def rendered(root: Path, blocks: Mapping[str, Block] = BLOCKS) -> dict[Path, tuple[str, str, list[str]]]:
    """Per doc: (its text now, its text with every block written from data, the names of the blocks that differ)."""
    out: dict[Path, tuple[str, str, list[str]]] = {}
    for name, block in blocks.items():
        if block.doc not in out:
            text = (root / block.doc).read_text()
            out[block.doc] = (text, text, [])
        before, text, stale = out[block.doc]
        new = fill(text, name, block.write(root), block.doc)
        if new != text:
            stale = [*stale, name]
        out[block.doc] = (before, new, stale)
    return out


def stale_blocks(root: Path = ROOT) -> list[str]:
    """``doc: block`` for every block whose text differs from what its JSON gives."""
    return [f"{doc}: {name}" for doc, (_, _, names) in rendered(root).items() for name in names]


def write_all(root: Path = ROOT) -> list[str]:
    """Rewrite every block from its JSON; the ``doc: block`` entries that changed."""
    changed = []
    for doc, (before, new, names) in rendered(root).items():
        if new != before:
            (root / doc).write_text(new)
        changed += [f"{doc}: {name}" for name in names]
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block differs from its JSON")
    p.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = p.parse_args(argv)
    try:
        names = stale_blocks(args.root) if args.check else write_all(args.root)
    except DocTablesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    verb = "differs from its JSON" if args.check else "rewritten"
    for name in names:
        print(f"{name}: {verb}")
    if not names:
        print("every generated block matches its JSON")
    return 1 if args.check and names else 0


if __name__ == "__main__":
    raise SystemExit(main())
