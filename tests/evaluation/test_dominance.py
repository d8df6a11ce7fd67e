"""The shipped cascade against the other models of its run, on test (pipeline.evaluation.dominance)."""

from __future__ import annotations

import math

import pytest

from pipeline.evaluation.dominance import dominance, held_out_choice, std_error


def results(
    cascade: tuple[float, float],
    exits: list[tuple[float, float]],
    small: tuple[float, float],
    large: tuple[float, float] = (0.95, 9e6),
    two: tuple[float, float] = (0.94, 5e6),
) -> dict:
    row = lambda acc, macs: {"accuracy": acc, "mean_macs": macs}  # noqa: E731
    return {
        "cascade": row(*cascade),
        "each_exit_alone": [{"exit": k + 1, **row(*e)} for k, e in enumerate(exits)],
        "baselines": {"plain_small": row(*small), "plain_large": row(*large), "two_cnn_cascade": row(*two)},
    }


def test_a_cheaper_model_more_than_one_se_better_dominates():
    r = results((0.80, 2e6), [(0.70, 1e6), (0.81, 3e6)], small=(0.86, 1.5e6))
    out = dominance(r, 400)  # SE of 0.80 on 400 images: 2 points
    assert out["dominated"] and out["dominated_by"] == ["plain_small"]
    assert out["verdict"].startswith("DOMINATED: plain_small reads +6.00 points at 0.75x")
    assert out["se"] == pytest.approx(math.sqrt(0.8 * 0.2 / 400))


def test_within_one_se_or_costlier_is_not_domination():
    r = results((0.80, 2e6), [(0.70, 1e6), (0.81, 3e6)], small=(0.815, 1.5e6))  # +1.5 points < 1 SE
    out = dominance(r, 400)
    assert not out["dominated"] and out["within_best_exit"] and out["verdict"].startswith("not dominated:")
    assert not dominance(results((0.80, 2e6), [(0.70, 1e6), (0.99, 3e6)], small=(0.5, 1e6)), 400)["dominated"]


def test_an_exit_alone_can_dominate_and_the_gap_to_the_best_exit_is_said():
    r = results((0.90, 2e6), [(0.95, 1.9e6), (0.96, 3e6)], small=(0.5, 1e6))
    out = dominance(r, 10_000)
    assert out["dominated_by"] == ["exit 1 alone"] and out["gap_to_best_exit_pts"] == pytest.approx(6.0)
    far = dominance(results((0.90, 2e6), [(0.5, 1e6), (0.96, 3e6)], small=(0.5, 1e6)), 10_000)
    assert not far["dominated"] and not far["within_best_exit"] and "under its best exit" in far["verdict"]


def test_std_error_needs_images():
    assert std_error(0.5, 100) == pytest.approx(0.05)
    with pytest.raises(ValueError):
        std_error(0.5, 0)


def test_a_better_model_at_nearly_the_same_cost_is_named_not_hidden():
    # bench.own_data's scenes, seed 1: plain_small 18 points better at 1.01x the cascade's MACs
    r = results((0.54, 2.18e6), [(0.30, 1.0e6), (0.54, 2.19e6)], small=(0.72, 2.21e6), two=(0.88, 15e6))
    out = dominance(r, 480)
    assert not out["dominated"] and out["nearly_dominated_by"] == ["plain_small"]
    assert out["verdict"].startswith("not dominated by the rule")
    assert "plain_small reads +18.00 points at 1.01x" in out["verdict"]
    farther = dominance(results((0.54, 2.18e6), [(0.30, 1e6), (0.54, 2.19e6)], small=(0.72, 2.5e6)), 480)
    assert farther["nearly_dominated_by"] == [] and farther["verdict"].startswith("not dominated:")
    both = dominance(results((0.54, 2.18e6), [(0.70, 2e6), (0.54, 2.19e6)], small=(0.72, 2.21e6)), 480)
    assert both["dominated_by"] == ["exit 1 alone"] and both["verdict"].startswith("DOMINATED")


# ------------------------------------------------------------------------------- what ships (held out)


def test_a_plain_cnn_ships_when_held_out_images_prefer_it_at_about_its_cost():
    cascade = {"accuracy": 0.60, "mean_macs": 2e6}  # SE on 384 images: 2.5 points
    plains = {"plain_small": {"accuracy": 0.75, "mean_macs": 2.1e6},
              "plain_large": {"accuracy": 0.90, "mean_macs": 17e6}}
    out = held_out_choice(cascade, plains, 384)
    assert out["model"] == "plain_small" and out["reason"].startswith("plain_small ships instead of the cascade")
    assert [r["beats_cascade"] for r in out["plains"]] == [True, False]  # 1.05x: nearly; 8.5x: not at its cost
    assert held_out_choice(cascade, {**plains, "plain_small": {"accuracy": 0.75, "mean_macs": 1e6}},
                           384)["model"] == "plain_small"  # cheaper and better: dominates


def test_the_cascade_ships_unless_a_plain_cnn_is_more_than_one_se_better_at_about_its_cost():
    cascade = {"accuracy": 0.60, "mean_macs": 2e6}
    assert held_out_choice(cascade, {"plain_small": {"accuracy": 0.59, "mean_macs": 1e6}}, 384)["model"] == "cascade"
    assert held_out_choice(cascade, {"plain_small": {"accuracy": 0.62, "mean_macs": 2.1e6}}, 384)["model"] == "cascade"
    out = held_out_choice(cascade, {"plain_small": {"accuracy": 0.75, "mean_macs": 2.3e6}}, 384)  # 1.15x
    assert out["model"] == "cascade" and out["reason"].startswith("the cascade ships")
    both = {"plain_small": {"accuracy": 0.70, "mean_macs": 1e6}, "plain_large": {"accuracy": 0.72, "mean_macs": 2e6}}
    assert held_out_choice(cascade, both, 384)["model"] == "plain_large"  # the most accurate of those that beat it
    with pytest.raises(ValueError, match="cannot ship"):
        held_out_choice(cascade, {"two_cnn_cascade": {"accuracy": 0.9, "mean_macs": 1e6}}, 384)


def test_a_cheaper_plain_cnn_no_less_accurate_on_held_out_images_ships():
    cascade = {"accuracy": 0.9193, "mean_macs": 2.63e6}  # the scenes' seed 0: SE on 384 images 1.39 points
    out = held_out_choice(cascade, {"plain_small": {"accuracy": 0.9271, "mean_macs": 2.21e6}}, 384)
    assert out["model"] == "plain_small" and "no less accurate at no more MACs" in out["reason"]
    assert held_out_choice(cascade, {"plain_small": {"accuracy": 0.9193, "mean_macs": 2.21e6}}, 384)["model"] == (
        "plain_small")  # a tie
    assert held_out_choice(cascade, {"plain_small": {"accuracy": 0.9167, "mean_macs": 2.21e6}}, 384)["model"] == (
        "cascade")  # one image fewer right
    assert held_out_choice(cascade, {"plain_small": {"accuracy": 0.9271, "mean_macs": 2.76e6}}, 384)["model"] == (
        "cascade")  # 1.05x its MACs: only more than one SE better ships


def test_a_shipped_plain_cnn_is_judged_against_the_cascade_too():
    r = results((0.64, 3.2e6), [(0.50, 2e6), (0.60, 3e6)], small=(0.80, 2.2e6), large=(0.88, 17e6))
    cascade_view = dominance(r, 160)
    assert cascade_view["dominated_by"] == ["plain_small"]
    out = dominance(r, 160, shipped="plain_small")
    assert out["model"] == "plain_small" and out["accuracy"] == 0.80 and not out["dominated"]
    names = [row["model"] for row in out["others"]]
    assert "cascade" in names and "plain_small" not in names
    worse = results((0.90, 1e6), [(0.50, 0.5e6), (0.91, 1.1e6)], small=(0.70, 2e6))
    verdict = dominance(worse, 400, shipped="plain_small")["verdict"]
    assert verdict.startswith("DOMINATED: ") and "the shipped model (plain_small)'s MACs" in verdict
    with pytest.raises(ValueError, match="unknown shipped model"):
        dominance(r, 160, shipped="two_cnn_cascade")
