"""What ``bench/serving_load.py`` shows of its report: a per-second plot (p99 with the target line,
answered images/s, and the operating point in use; every mode on one figure) and a short printed table
per mode and step (docs/DESIGN.md 'Serving')."""

from __future__ import annotations

import os

COLOURS = {"none": "tab:blue", "p99": "tab:red"}


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.2f}" if signed else f"{100 * value:.2f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def point_order(report: dict) -> list[str]:
    """The model's points from the accuracy-first one down (the manifest's order), then any other name an
    answer gave."""
    names = list(report["held_out"])
    for run in report["modes"].values():
        for row in run["seconds"]:
            if row["point"] is not None and row["point"] not in names:
                names.append(row["point"])
    return names


def plot(report: dict, path: str | os.PathLike[str]) -> None:
    """Three panels over the run's seconds, one line per mode: p99 (ms, log) with the target, answered
    images/s, and the point in use (the accuracy-first at the top); the steps' starts dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from pipeline.io import atomic_path

    names = point_order(report)
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for mode, run in report["modes"].items():
        t = [r["t"] + 0.5 for r in run["seconds"]]
        label = f"p99 target {report['p99_ms']:g} ms" if mode == "p99" else "no target"
        style = {"color": COLOURS.get(mode), "label": label}
        axes[0].plot(t, [r.get("p99_ok_ms", r["p99_ms"]) for r in run["seconds"]], marker=".", **style)
        axes[1].plot(t, [r["images_per_s"] for r in run["seconds"]], marker=".", **style)
        axes[2].step(t, [names.index(r["point"]) if r["point"] in names else None for r in run["seconds"]],
                     where="mid", **style)
        for phase in run["phases"][1:]:
            for ax in axes:
                ax.axvline(phase["start"], color=style["color"], linestyle=":", linewidth=0.8)
    axes[0].axhline(report["p99_ms"], color="black", linestyle="--", linewidth=1, label="target")
    axes[0].set_yscale("log")
    axes[0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axes[0].yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axes[0].set_ylabel("answers' p99 per second (ms)")
    axes[1].set_ylabel("answered images/s")
    axes[2].set_yticks(range(len(names)), names)
    axes[2].set_ylim(len(names) - 0.5, -0.5)
    axes[2].set_ylabel("point in use")
    steps = ", ".join(f"{c} clients{'' if q is None else f' at {q:g}/s'} {s:g} s" for c, s, q in report["steps"])
    axes[2].set_xlabel(f"seconds since the load started (steps: {steps})")
    axes[0].legend(loc="upper left", fontsize=8)
    axes[0].set_title(f"cascade serve under a load step: {report['images_per_request']} image(s) per request, "
                      f"{report['engine']} engine", fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def print_table(report: dict) -> None:
    """Per mode and step: load figures, the probe's accuracy beside the held-out figure of the points it
    was answered at, those points; then the high-load step pooled and the recovery after each fall."""
    print(f"{'mode':5s} {'step':>12s} {'images/s':>9s} {'p50 ms':>7s} {'p99 ms':>7s} {'ok p99':>7s} {'worst/s':>8s} "
          f"{'non200':>6s} {'429 p99':>7s} "
          f"{'busy':>5s} {'probe %':>8s} {'SE':>5s} {'held %':>7s} {'diff':>6s}  points (share of probe images)")
    for mode, run in report["modes"].items():
        for phase in run["phases"]:
            pr = phase["probe"]
            shares = ", ".join(f"{p} {100 * s:.0f}%" for p, s in pr["shares"].items())
            print(f"{mode:5s} {phase['clients']:>5d} x {phase['seconds']:>3g}s {phase['images_per_s']:9.1f} "
                  f"{_ms(phase['p50_ms']):>7s} {_ms(phase['p99_ms']):>7s} {_ms(phase.get('p99_ok_ms')):>7s} "
                  f"{_ms(phase['worst_p99_ms_after_2s']):>8s} {phase['non_200']:6d} "
                  f"{_ms(phase.get('p99_refused_ms')):>7s} "
                  f"{_pct(phase['engine_busy']):>5s} {_pct(pr['accuracy']):>8s} "
                  f"{_pct(pr['se']):>5s} {_pct(pr['held_out_weighted']):>7s} "
                  f"{_pct(pr['difference'], True):>6s}  {shares}")
        high = run["high_load"]["probe"]
        back = ", ".join("-" if r["back_at_accurate_s"] is None else f"{r['back_at_accurate_s']:.2f} s"
                         for r in run["recovery_s"])
        print(f"{mode:5s} high-load step: probe {_pct(high['accuracy'])}% (SE {_pct(high['se'])}) vs held-out "
              f"{_pct(high['held_out_weighted'])}% of the points used ({_pct(high['difference'], True)} pts); "
              f"back at accurate after each fall: {back or 'no fall'}")
