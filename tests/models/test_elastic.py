"""The elastic cascade: its space, the shapes it runs, and MACs that equal the fixed modules' count."""

from __future__ import annotations

import pytest
import torch

from pipeline.models.cost import count_macs
from pipeline.models.elastic import (
    ElasticCascade,
    ModuleChoices,
    ModuleShape,
    cascade_space,
    extreme_arch,
    shape_macs,
    shapes_of,
)
from pipeline.models.modules import FixedModule, ModuleSpec

CHOICES = (ModuleChoices(widths=(4, 8), depths=(1, 2, 3), strides=(1, 2), pools=(0, 1, 2)),
           ModuleChoices(widths=(8, 12), depths=(1, 2), strides=(1, 2)))


def test_space_names_each_decision_with_more_than_one_value() -> None:
    space = cascade_space((ModuleChoices(widths=(8,), depths=(1, 2), strides=(2,)),))
    assert space.labels == ("m1.depth",)
    assert cascade_space(CHOICES).size() == 2 * 3 * 2 * 3 * 2 * 2 * 2


def test_pools_beyond_the_depth_are_dropped() -> None:
    space = cascade_space(CHOICES)
    arch = space.make({"m1.width": "8", "m1.depth": "1", "m1.stride": "1", "m1.pools": "2",
                       "m2.width": "8", "m2.depth": "2", "m2.stride": "2"})
    assert shapes_of(arch, CHOICES)[0] == ModuleShape(width=8, depth=1, stride=1, pools=1)


def test_the_corners_span_the_cost_range() -> None:
    """The largest corner is the dearest shape; the smallest is among the cheapest (not always the
    cheapest: a deeper module 1 that pools twice hands module 2 a smaller map)."""
    space = cascade_space(CHOICES)
    costs = sorted(sum(shape_macs(shapes_of(a, CHOICES), 3, 32, 10)) for a in space.enumerate())
    assert costs[-1] == sum(shape_macs(shapes_of(extreme_arch(space, True), CHOICES), 3, 32, 10))
    smallest = sum(shape_macs(shapes_of(extreme_arch(space, False), CHOICES), 3, 32, 10))
    assert smallest <= costs[len(costs) // 20]


@pytest.mark.parametrize("shape", [ModuleShape(8, 3, 1, 2), ModuleShape(4, 1, 2, 0), ModuleShape(8, 2, 2, 1)])
def test_macs_equal_the_count_of_the_fixed_module_that_ships(shape: ModuleShape) -> None:
    """What the architect prices is what the pipeline will build from the chosen spec."""
    spec = ModuleSpec("fixed", shape.width, stride=shape.stride, layers=shape.depth, pools=shape.pools)
    fixed = FixedModule(spec, in_channels=3, num_classes=10)
    assert shape_macs([shape], 3, 32, 10) == [count_macs(fixed, (3, 32, 32))]


def test_a_shape_runs_its_own_width_and_resolution_on_shared_weights() -> None:
    torch.manual_seed(0)
    net = ElasticCascade(3, 10, CHOICES)
    x = torch.randn(6, 3, 32, 32)
    shapes = [ModuleShape(4, 2, 1, 2), ModuleShape(12, 1, 2, 0)]
    h, z = net.modules_[0](x, shapes[0])
    assert h.shape == (6, 4, 8, 8) and z.shape == (6, 10)
    logits = net.forward_all(x, shapes)
    assert [t.shape for t in logits] == [(6, 10), (6, 10)]
    # the narrow path reads a slice of the wide path's weights: a change outside the slice leaves it alone
    before = logits[0].detach().clone()
    with torch.no_grad():
        net.modules_[0].transition.weight[4:] += 1.0
    assert torch.equal(net.forward_all(x, shapes)[0], before)


def test_bad_choices_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="strides must be 1 or 2"):
        ModuleChoices(widths=(8,), depths=(1,), strides=(3,))
    with pytest.raises(ValueError, match="widths"):
        ModuleChoices(widths=(), depths=(1,))
