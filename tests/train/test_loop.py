from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.models.cascade import CascadeSpec, build_modules, feature_shapes
from pipeline.models.cost import fixed_macs, op_mac_table, path_macs
from pipeline.models.modules import NO_ARCH, ModuleSpec
from pipeline.search.probmodel import ProbModel
from pipeline.train import loop
from pipeline.train.config import TrainConfig, learning_rate
from pipeline.train.data import ERASE_AREA, ImageBatches, random_crop, random_erase
from pipeline.train.loop import TrainingDiverged, make_optimizer, train_module
from pipeline.train.paths import evaluate_path, module_outputs, recalibrate_batchnorm
from pipeline.train.prefix import Prefix
from pipeline.train.steps import distillation_loss, extreme_archs, soft_target_loss

SPEC = CascadeSpec(
    in_channels=1,
    num_classes=4,
    image_size=12,
    modules=(
        ModuleSpec("fixed", 8, stride=1, layers=1),
        ModuleSpec("supernet", 12, stride=2, layers=2, ops=("conv3", "dw3", "ir3_e3", "skip"),
                   default_op="conv3"),
    ),
)
MEAN, STD = (0.2,), (0.3,)


def pattern_data(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Noise plus one texture per class: horizontal stripes, vertical stripes, checkerboard, flat.

    Textures, not positions: exit heads average-pool, and flips and crops keep every class intact.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=n)
    r, c = np.indices((12, 12))
    textures = np.stack([(r // 2) % 2, (c // 2) % 2, ((r // 2) + (c // 2)) % 2, np.full((12, 12), 0.5)])
    noise = rng.integers(0, 80, size=(n, 1, 12, 12))
    images = (noise + 150 * textures[labels][:, None]).astype(np.uint8)  # (N, 1, 12, 12)
    return images, labels


def cfg(**kw: object) -> TrainConfig:
    base = dict(epochs=2, batch_size=32, lr=0.05, schedule="cosine", crop_padding=1, flip=True,
                lam=0.5, mu=0.5, seed=3, sampler="probmodel", m=4, warmup_epochs=0.0, smoothing=0.05,
                sandwich=False, kd_temperature=1.0)  # single-path training unless a test turns the sandwich on
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def costs(modules: torch.nn.ModuleList, k: int):  # noqa: ANN201 - (cost_of, cost_max)
    shape = feature_shapes(SPEC)[k]
    module = modules[k]
    table, fixed = op_mac_table(module, shape), fixed_macs(module, shape)
    if not table:
        return (lambda arch: float(fixed)), float(fixed)
    cost_max = fixed + sum(max(ops.values()) for ops in table.values())
    return (lambda arch: float(path_macs(table, fixed, arch))), float(cost_max)


def train(k: int, config: TrainConfig, modules: torch.nn.ModuleList | None = None, prefix_epochs: int = 0,
          layout: str = "channels_last", soft_targets: np.ndarray | None = None):
    """Build the cascade (seed 0); optionally train module 1 first; then train module k."""
    modules = build_modules(SPEC, seed=0) if modules is None else modules
    images, labels = pattern_data()
    stages = tuple((modules[j], NO_ARCH) for j in range(k))
    prefix = Prefix(stages, MEAN, STD)
    cost_of, cost_max = costs(modules, k)
    result = train_module(modules[k], prefix, images, labels, config, cost_of=cost_of, cost_max=cost_max,
                          exit_saving=0.5, progress=False, layout=layout, soft_targets=soft_targets)
    return modules, prefix, result


def state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_fixed_module_training_reduces_loss_and_learns() -> None:
    modules, prefix, result = train(0, cfg(epochs=4, lr=0.1))
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0]
    assert result.prob_model is None and result.iterations == []
    images, labels = pattern_data(100, seed=1)
    metrics = evaluate_path(modules[0], prefix, images, labels, NO_ARCH, batch_size=64)
    assert metrics["acc"] > 0.6
    assert set(metrics) >= {"acc", "ce", "conf_mean"}
    for key in ("loss", "ce", "train_acc", "lr", "seconds", "images_per_s"):
        assert math.isfinite(result.history[-1][key])


def test_same_config_gives_bitwise_identical_weights() -> None:
    a, _, ra = train(1, cfg())
    b, _, rb = train(1, cfg())
    assert_bitwise_equal(state(a[1]), state(b[1]))
    assert [i["most_likely"] for i in ra.iterations] == [i["most_likely"] for i in rb.iterations]
    c, _, _ = train(1, cfg(seed=4))
    assert not torch.equal(state(a[1])["head.fc.weight"], state(c[1])["head.fc.weight"])


def test_the_training_layout_changes_rounding_only_and_hands_back_standard_weights() -> None:
    # The supernet draws its paths uniformly here: method B's draws follow the ranks of rounded losses, so one
    # flipped rank sends a step down another path and its layers' weights apart (1e-2, not rounding)
    for k in (0, 1):  # the fixed module 1, then the supernet behind it
        a, _, ra = train(k, cfg(epochs=2, sampler="uniform"))
        b, _, rb = train(k, cfg(epochs=2, sampler="uniform"), layout="contiguous")
        for module in (a[k], *a[:k]):
            assert all(p.is_contiguous() for p in module.parameters())  # saved files keep the usual strides
        sa, sb = state(a[k]), state(b[k])
        # rounding, compared at each tensor's own scale: 2 epochs of drift moved a BatchNorm running mean of
        # scale 0.21 by 1.3e-3 on an Intel Xeon (1e-3 elementwise held on an AMD EPYC)
        for key in sa:
            gap = (sa[key].float() - sb[key].float()).abs().max()
            assert gap <= 1e-3 + 1e-2 * sb[key].float().abs().max(), key
        assert [h["loss"] for h in ra.history] == pytest.approx([h["loss"] for h in rb.history], rel=1e-3)
    with pytest.raises(ValueError, match="layout"):
        train(0, cfg(epochs=1), layout="nhwc")


def test_prefix_is_bitwise_unchanged_by_training_the_next_module() -> None:
    modules, _, _ = train(0, cfg(epochs=1))
    modules[0].train()  # as a careless caller might leave it: the prefix must still not move BN stats
    before = state(modules[0])
    train(1, cfg(epochs=1), modules)
    assert_bitwise_equal(before, state(modules[0]))
    assert all(not p.requires_grad for p in modules[0].parameters())
    assert any(key.endswith("num_batches_tracked") for key in before)


def test_probmodel_sampler_records_finite_mi_and_moving_entropy() -> None:
    _, _, result = train(1, cfg(beta=0.01))
    its = result.iterations
    assert len(its) == 2 * (200 // 32)
    assert math.isnan(its[0]["mi"])  # P(0) uniform: MI undefined, term skipped
    assert all(math.isfinite(i["mi"]) for i in its[1:])
    entropies = [i["entropy"] for i in its]
    assert entropies[0] < math.log(4**2) + 1e-9
    assert len(set(entropies)) > 1
    assert all(isinstance(v, (float, int, str)) for i in its for v in i.values())
    assert isinstance(result.prob_model, ProbModel) and not result.prob_model.is_uniform()
    last = result.history[-1]
    assert {"entropy", "mi", "best_perf", "mean_perf", "most_likely"} <= set(last)


@pytest.mark.parametrize("sampler", ["uniform", "probmodel"])
@pytest.mark.parametrize("pick", ["entropy", "greedy", "plain"])
def test_both_samplers_run(sampler: str, pick: str) -> None:
    modules, prefix, result = train(1, cfg(epochs=1, sampler=sampler, pick=pick,
                                           label_smoothing=0.1, schedule="step", warmup_epochs=0.5))
    assert len(result.history) == 1 and math.isfinite(result.history[0]["loss"])
    if sampler == "uniform":
        assert result.prob_model is None and result.iterations == []
        assert result.history[0]["entropy"] == pytest.approx(math.log(16))
    images, _ = pattern_data(10)
    logits, feats = module_outputs(modules[1], prefix, images, modules[1].default_arch(), 4, features=True)
    assert logits.shape == (10, 4) and feats is not None and feats.shape == (10, 12, 6, 6)
    assert module_outputs(modules[1], prefix, images, modules[1].default_arch(), 4)[1] is None


def test_on_epoch_sees_every_epoch_with_the_module_and_p() -> None:
    modules = build_modules(SPEC, seed=0)
    images, labels = pattern_data()
    cost_of, cost_max = costs(modules, 1)
    seen = []

    def on_epoch(epoch, record, module, model) -> None:  # noqa: ANN001
        seen.append((epoch, module is modules[1], model is not None))

    train_module(modules[1], Prefix(((modules[0], NO_ARCH),), MEAN, STD), images, labels, cfg(),
                 cost_of=cost_of, cost_max=cost_max, exit_saving=0.5, on_epoch=on_epoch, progress=False)
    assert seen == [(1, True, True), (2, True, True)]


@pytest.mark.parametrize(
    ("field", "value"),
    [("epochs", 0), ("batch_size", -1), ("lr", 0.0), ("momentum", 1.0), ("schedule", "linear"),
     ("warmup_epochs", 5), ("crop_padding", -1), ("flip", 1), ("lam", -0.1), ("sampler", "random"),
     ("m", 64), ("pool_factor", 0), ("temperature", 0.0), ("step", 0.0), ("beta", -1.0),
     ("mi_eps", 0.0), ("lambda_c", float("nan")), ("label_smoothing", 1.0), ("seed", 1.5),
     ("kd", -1.0), ("kd_temperature", 0.0), ("grad_clip", -1.0)],
)
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"TrainConfig\.{field}\b"):
        cfg(**{field: value})


def test_config_from_dict_rejects_unknown_keys() -> None:
    good = dataclasses.asdict(cfg())
    assert TrainConfig.from_dict(good) == cfg()
    with pytest.raises(ValueError, match="lr_max"):
        TrainConfig.from_dict({**good, "lr_max": 1.0})


def test_learning_rate_schedules() -> None:
    c = cfg(epochs=4, lr=1.0, warmup_epochs=1)
    assert learning_rate(c, 0, 10) == pytest.approx(0.1)
    assert learning_rate(c, 9, 10) == pytest.approx(1.0)
    assert learning_rate(c, 10, 10) == pytest.approx(1.0)
    assert learning_rate(c, 39, 10) < 0.01
    step = dataclasses.replace(c, schedule="step", warmup_epochs=0)
    assert [learning_rate(step, i, 10) for i in (0, 19, 20, 30)] == pytest.approx([1.0, 1.0, 0.1, 0.01])


def test_make_optimizer_spares_1d_parameters_from_weight_decay() -> None:
    """The recipe's optimizer: weight decay on the weights (ndim > 1), none on BatchNorm and biases,
    in that order; frozen parameters left out; Nesterov momentum; an empty group dropped."""
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                              torch.nn.Linear(4, 2))
    net[0].bias.requires_grad_(False)
    opt = make_optimizer(net, cfg(lr=0.2, momentum=0.8, weight_decay=1e-3))
    decay, no_decay = opt.param_groups
    assert decay["params"] == [net[0].weight, net[3].weight] and decay["weight_decay"] == 1e-3
    assert no_decay["params"] == [net[1].weight, net[1].bias, net[3].bias] and no_decay["weight_decay"] == 0.0
    assert all(g["lr"] == 0.2 and g["momentum"] == 0.8 and g["nesterov"] for g in opt.param_groups)
    only_1d = make_optimizer(torch.nn.BatchNorm2d(3), cfg(momentum=0.0))
    assert [g["weight_decay"] for g in only_1d.param_groups] == [0.0]
    assert not only_1d.param_groups[0]["nesterov"]


def test_train_module_uses_make_optimizer(monkeypatch: pytest.MonkeyPatch) -> None:
    made = []

    def spy(module: torch.nn.Module, config: TrainConfig) -> torch.optim.SGD:
        made.append(make_optimizer(module, config))
        return made[-1]

    monkeypatch.setattr(loop, "make_optimizer", spy)
    modules, _, _ = train(0, cfg(epochs=1))
    assert len(made) == 1
    trained = {id(q) for g in made[0].param_groups for q in g["params"]}
    assert trained == {id(q) for q in modules[0].parameters()}


def test_augmentation_is_deterministic_given_seed() -> None:
    images, labels = pattern_data(50)

    def epoch(seed: int, e: int) -> list[torch.Tensor]:
        data = ImageBatches(images, labels, 16, mean=MEAN, std=STD, shuffle=True, crop_padding=2, flip=True,
                            seed=seed)
        return [x for x, _ in data.epoch(e)]

    a, b = epoch(0, 1), epoch(0, 1)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(epoch(0, 2)[0], a[0])
    assert not torch.equal(epoch(1, 1)[0], a[0])


def test_plain_batches_are_normalised_images_in_order() -> None:
    images, labels = pattern_data(10)
    batches = list(ImageBatches(images, labels, 4, mean=MEAN, std=STD))
    assert [len(y) for _, y in batches] == [4, 4, 2]
    x = torch.cat([x for x, _ in batches])  # (10, 1, 12, 12)
    expected = (torch.from_numpy(images).float() / 255 - MEAN[0]) / STD[0]
    assert torch.allclose(x, expected)
    assert torch.equal(torch.cat([y for _, y in batches]), torch.from_numpy(labels))
    assert len(ImageBatches(images, labels, 4, drop_last=True)) == 2
    assert len(ImageBatches(images, labels, 16, drop_last=True)) == 1  # the only batch is kept


def test_random_crop_shifts_with_zero_border() -> None:
    x = torch.arange(1, 17, dtype=torch.uint8).reshape(1, 1, 4, 4).repeat(64, 1, 1, 1)  # (64, 1, 4, 4)
    out = random_crop(x, 1, torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    for img in out:
        # every crop is the padded image at some offset in [0, 2]^2
        padded = torch.nn.functional.pad(x[0], (1, 1, 1, 1))
        assert any(torch.equal(img, padded[:, dy:dy + 4, dx:dx + 4]) for dy in range(3) for dx in range(3))
    assert len({tuple(img.flatten().tolist()) for img in out}) > 1


def test_random_erase_blanks_one_rectangle_per_hit_image() -> None:
    x = torch.full((256, 1, 28, 28), 200, dtype=torch.uint8)  # (256, 1, 28, 28)
    out = random_erase(x, 0.5, torch.Generator().manual_seed(0))
    zeros = (out == 0).squeeze(1)  # (256, 28, 28)
    hit = zeros.flatten(1).any(dim=1)  # (256,)
    assert 0.35 < hit.float().mean() < 0.65  # about half the images
    assert bool((out[~hit] == 200).all())  # the others untouched
    for img in zeros[hit]:
        rows, cols = img.any(dim=1).nonzero().flatten(), img.any(dim=0).nonzero().flatten()
        h, w = int(rows[-1] - rows[0] + 1), int(cols[-1] - cols[0] + 1)
        assert int(img.sum()) == h * w  # one solid rectangle
        assert ERASE_AREA[0] * 784 / 2 <= h * w <= ERASE_AREA[1] * 784 * 1.5  # its area (rounding aside)
    assert torch.equal(random_erase(x, 0.0, torch.Generator().manual_seed(0)), x)  # off: unchanged
    again = random_erase(x, 0.5, torch.Generator().manual_seed(0))
    assert torch.equal(again, out)  # seeded: replayable


def test_image_batches_refuse_an_erase_probability_outside_0_1() -> None:
    images, labels = pattern_data(8)
    with pytest.raises(ValueError, match="erase"):
        ImageBatches(images, labels, 4, erase=1.5)


def test_training_a_frozen_or_prefix_module_is_refused() -> None:
    modules = build_modules(SPEC, seed=0)
    images, labels = pattern_data(40)
    prefix = Prefix(((modules[0], NO_ARCH),), MEAN, STD)
    frozen = build_modules(SPEC, seed=0)[0].requires_grad_(False)
    for module, match in ((modules[0], "prefix"), (frozen, "trainable")):
        with pytest.raises(ValueError, match=match):
            train_module(module, prefix, images, labels, cfg(), cost_of=lambda a: 1.0, cost_max=1.0,
                         exit_saving=0.5, progress=False)


def test_extreme_archs_are_the_most_and_least_expensive_paths() -> None:
    modules = build_modules(SPEC, seed=0)
    cost_of, cost_max = costs(modules, 1)
    largest, smallest = extreme_archs(modules[1].space, cost_of)
    every = [cost_of(a) for a in modules[1].space.enumerate()]
    assert cost_of(largest) == max(every) == cost_max
    assert cost_of(smallest) == min(every)
    assert set(smallest.as_dict().values()) == {"skip"}


def test_sandwich_trains_the_largest_and_smallest_paths_every_step() -> None:
    # With m = 1 method B picks one path per step; only the sandwich can touch both extremes each step.
    modules = build_modules(SPEC, seed=0)
    cost_of, _ = costs(modules, 1)
    largest, _ = extreme_archs(modules[1].space, cost_of)
    before = state(modules[1])
    config = cfg(epochs=1, m=1, sandwich=True, distill=1.0)
    train(1, config, modules)
    heavy = [k for k in before if k.startswith("layers.") and largest[f"op@l{int(k.split('.')[1]) + 1}"] in k]
    assert heavy and all(not torch.equal(before[k], modules[1].state_dict()[k]) for k in heavy
                         if k.endswith("weight"))
    plain = build_modules(SPEC, seed=0)
    train(1, cfg(epochs=1, m=1), plain)
    assert any(not torch.equal(plain[1].state_dict()[k], modules[1].state_dict()[k]) for k in heavy)


def test_sandwich_is_deterministic_and_never_feeds_the_mle() -> None:
    a, _, ra = train(1, cfg(sandwich=True, distill=0.5))
    b, _, rb = train(1, cfg(sandwich=True, distill=0.5))
    assert_bitwise_equal(state(a[1]), state(b[1]))
    # P(1) is fitted from the first step's picks alone: identical whether or not the sandwich ran
    # (raw perf on both sides: paired perf would subtract the sandwich's largest-path CE).
    _, _, rs = train(1, cfg(sandwich=True, distill=0.5, paired_perf=False))
    plain, _, rp = train(1, cfg(paired_perf=False))
    assert rs.iterations[0]["most_likely"] == rp.iterations[0]["most_likely"]
    assert rs.iterations[0]["entropy"] == pytest.approx(rp.iterations[0]["entropy"])


def test_distillation_loss_is_zero_for_identical_logits_and_positive_otherwise() -> None:
    z = torch.randn(5, 4)
    assert float(distillation_loss(z, z)) == pytest.approx(0.0, abs=1e-6)
    assert float(distillation_loss(z, z.flip(1))) > 0.01
    teacher = torch.randn(5, 4, requires_grad=True)
    kl = F.kl_div(F.log_softmax(z, dim=-1), F.log_softmax(teacher, dim=-1), log_target=True, reduction="batchmean")
    loss = distillation_loss(z, teacher)
    assert float(loss) == pytest.approx(float(kl.detach()), rel=1e-5)  # KL(teacher || student)
    assert not loss.requires_grad  # the teacher is not trained by it (z needs no grad here)


def test_soft_target_loss_is_zero_at_the_targets_and_scaled_by_temperature_squared() -> None:
    z = torch.randn(6, 4)
    for t in (1.0, 3.0):
        assert float(soft_target_loss(z, torch.softmax(z / t, dim=-1), t)) == pytest.approx(0.0, abs=1e-6)
    soft = torch.softmax(torch.randn(6, 4), dim=-1)
    kl = F.kl_div(F.log_softmax(z / 2, dim=-1), soft, reduction="batchmean")
    assert float(soft_target_loss(z, soft, 2.0)) == pytest.approx(4 * float(kl), rel=1e-5)


@pytest.mark.parametrize("k", [0, 1])  # a fixed module and a supernet (sandwich, chunks)
def test_soft_targets_reach_each_image_in_shuffled_augmented_batches(k: int) -> None:
    """Targets that name another class than the label, with a heavy weight, win over the labels: each
    image's own row reached it through the shuffle (a misaligned lookup would teach noise)."""
    images, labels = pattern_data()
    shifted = np.eye(4, dtype=np.float32)[(labels + 1) % 4]  # (N, 4): the next class, one-hot
    config = cfg(epochs=4, lr=0.1, kd=4.0) if k == 0 else cfg(epochs=6, lr=0.01, kd=4.0, sandwich=True)
    modules, prefix, _ = train(k, config, soft_targets=shifted)
    logits, _ = module_outputs(modules[k], prefix, images, modules[k].default_arch(), 64)
    predicted = logits.argmax(dim=-1).numpy()
    assert (predicted == (labels + 1) % 4).mean() > 0.9
    assert (predicted == labels).mean() < 0.1


def test_zero_kd_ignores_soft_targets_bitwise() -> None:
    images, labels = pattern_data()
    a, _, _ = train(1, cfg())
    b, _, _ = train(1, cfg(), soft_targets=np.full((len(labels), 4), 0.25, dtype=np.float32))
    assert_bitwise_equal(state(a[1]), state(b[1]))


@pytest.mark.parametrize("soft, match", [
    (None, "needs soft_targets"),
    (np.full((7, 4), 0.25, dtype=np.float32), "must be \\(N, K\\)"),
    (np.full((200, 4), 0.5, dtype=np.float32), "probabilities"),
])
def test_kd_refuses_missing_or_bad_soft_targets(soft: np.ndarray | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        train(0, cfg(kd=1.0), soft_targets=soft)


def test_distill_needs_the_sandwich() -> None:
    with pytest.raises(ValueError, match="TrainConfig.distill"):
        cfg(distill=0.5)


def test_recalibrate_batchnorm_touches_only_the_path_and_fits_its_statistics() -> None:
    modules, prefix, _ = train(1, cfg(epochs=1))
    supernet = modules[1]
    arch = supernet.space.make({"op@l1": "conv3", "op@l2": "dw3"})
    before = state(supernet)
    images, _ = pattern_data(64, seed=4)
    recalibrate_batchnorm(supernet, prefix, images, arch, batch_size=16)
    after = state(supernet)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.endswith(("running_mean", "running_var", "num_batches_tracked")) for k in changed)
    assert not any(".ir3_e3." in k or ".skip." in k or "layers.1.conv3" in k for k in changed)
    # The transition's BatchNorm now holds the mean of its inputs over exactly these images.
    with torch.no_grad():
        h = torch.cat([supernet.transition[0](prefix(x)) for x, _ in prefix.batches(images, np.zeros(64, int), 64,
                                                                                        torch.device("cpu"))])
    assert torch.allclose(supernet.transition[1].running_mean, h.mean(dim=(0, 2, 3)), atol=1e-5)


def test_a_diverging_run_stops_with_a_clear_error_and_grad_clip_keeps_it_finite() -> None:
    """An absurd learning rate makes the loss NaN within steps (as KD on a supernet at position 1 did at
    lr 0.1): training stops naming the epoch and step instead of going on with NaN weights; clipping the
    gradients' norm keeps the same run finite."""
    with pytest.raises(TrainingDiverged, match=r"diverged: the loss is (nan|inf) at epoch \d, step \d+ of 6"):
        train(0, cfg(epochs=2, lr=10.0, warmup_epochs=0.0))
    _, _, result = train(0, cfg(epochs=2, lr=10.0, warmup_epochs=0.0, grad_clip=0.1))
    assert all(math.isfinite(h["loss"]) for h in result.history)


def test_grad_clip_off_changes_nothing() -> None:
    a, _, _ = train(0, cfg(epochs=1))
    b, _, _ = train(0, cfg(epochs=1, grad_clip=0.0))
    assert_bitwise_equal(state(a[0]), state(b[0]))
