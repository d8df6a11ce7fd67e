"""The architect: its space follows the input and the plain CNN, it trains and searches end to end, the
same seed gives the same choice, and the one-SE rule picks the cheapest near-best shape."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.architect.search import ArchitectConfig, Scored, architect, choose, default_choices
from pipeline.io import Split
from pipeline.models.cost import count_macs
from pipeline.models.elastic import ModuleShape, cascade_space, extreme_arch, shape_macs, shapes_of
from pipeline.models.modules import PlainCNN
from pipeline.search.space import Arch


@pytest.mark.parametrize(("side", "channels", "width"), [(16, 1, 8), (28, 1, 24), (48, 3, 12), (64, 3, 12)])
def test_the_deepest_shape_reaches_plain_large_on_any_input(side: int, channels: int, width: int) -> None:
    choices = default_choices(side, width)
    space = cascade_space(choices)
    largest = sum(shape_macs(shapes_of(extreme_arch(space, True), choices), channels, side, 10))
    assert largest >= count_macs(PlainCNN(width, channels, 10), (channels, side, side))
    assert choices[0].strides == ((2,) if side > 32 else (1,))


def _data(n: int, seed: int) -> Split:
    """A learnable toy: the class is which quadrant holds a bright square."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n)
    images = rng.integers(0, 60, (n, 1, 16, 16)).astype(np.uint8)
    for i, c in enumerate(labels):
        r, q = divmod(int(c), 2)
        images[i, 0, 8 * r + 2:8 * r + 6, 8 * q + 2:8 * q + 6] = 250
    return Split("toy", images, labels.astype(np.int64), np.array([f"{seed}-{i}" for i in range(n)]))


def test_trains_searches_and_chooses_one_of_the_scored_shapes_reproducibly() -> None:
    train, held = _data(256, 0), _data(128, 1)
    choices = default_choices(16, 4, modules=2)
    cfg = ArchitectConfig(epochs=2, batch_size=32, budget=5, m=1)
    first = architect(train, held, choices, cfg)
    scored = first["scored"]
    assert 2 < len(scored) <= 5 and len({s.arch for s in scored}) == len(scored)
    assert first["chosen"] in scored
    assert all(0.0 <= s.accuracy <= 1.0 and s.mean_macs <= s.exit_macs[-1] for s in scored)
    assert max(s.accuracy for s in scored) > 0.5  # the quadrant is learnt in two epochs
    again = architect(train, held, choices, cfg)
    assert again["chosen"].arch == first["chosen"].arch
    assert [s.accuracy for s in again["scored"]] == [s.accuracy for s in scored]


def _scored(name: str, accuracy: float, macs: float) -> Scored:
    shape = ModuleShape(8, 1, 1, 0)
    return Scored(Arch((("x", name),)), (shape,), accuracy, macs, (accuracy,), (int(macs),), 0.0)


def test_choose_takes_the_cheapest_within_one_standard_error_of_the_best() -> None:
    best, near, cheap_far = _scored("a", 0.90, 10e6), _scored("b", 0.89, 4e6), _scored("c", 0.80, 1e6)
    # SE of 0.90 on 400 images is 1.5 points: b is within it, c is not
    assert choose([best, near, cheap_far], 400) is near
    # on 40,000 images the SE is 0.15 points: only the best itself
    assert choose([best, near, cheap_far], 40_000) is best


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="sampler"):
        ArchitectConfig(sampler="greedy")
    with pytest.raises(ValueError, match="budget"):
        ArchitectConfig(budget=0)


def test_choose_keeps_to_a_ceiling_on_mean_macs() -> None:
    best, mid, cheap = _scored("a", 0.95, 10e6), _scored("b", 0.90, 4e6), _scored("c", 0.89, 1e6)
    assert choose([best, mid, cheap], 40_000) is best
    assert choose([best, mid, cheap], 40_000, max_macs=5e6) is mid  # the best under the ceiling
    assert choose([best, mid, cheap], 400, max_macs=5e6) is cheap  # within one SE (1.5 points) of it, cheaper
    assert choose([best, mid], 400, max_macs=1e6) is mid  # none under it: the cheapest
