from pipeline.models.cascade import CascadeSpec, build_modules, feature_shapes
from pipeline.models.cost import count_macs
from pipeline.models.modules import ModuleSpec
from pipeline.models.profile import CostModel, profile_cascade

SPEC = CascadeSpec(1, 10, 12, (
    ModuleSpec("fixed", 4, 1, 1),
    ModuleSpec("supernet", 8, 2, 2, ("conv3", "dw3", "skip"), "conv3"),
))


def test_cost_model_matches_counted_macs_and_bounds():
    costs = CostModel(profile_cascade(SPEC, seed=0, repeats=1))
    modules, shapes = build_modules(SPEC, 0), feature_shapes(SPEC)
    space = modules[1].space
    for arch in space.enumerate():
        assert costs.macs(2, arch) == count_macs(modules[1], shapes[1], arch)
        assert costs.min_macs(2) <= costs.macs(2, arch) <= costs.max_macs(2)
        assert costs.latency_ms(2, arch, 1) > 0 and costs.latency_ms(2, arch, 64) > 0
    assert costs.macs(1, costs.default_arch(1)) == count_macs(modules[0], shapes[0])


def test_exit_saving_is_the_share_of_later_cost():
    costs = CostModel(profile_cascade(SPEC, seed=0, repeats=1))
    c1, c2 = costs.macs(1, costs.default_arch(1)), costs.macs(2, costs.default_arch(2))
    assert abs(costs.exit_saving(1) - c2 / (c1 + c2)) < 1e-12
    assert costs.exit_saving(2) == 0.0
