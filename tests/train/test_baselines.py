"""Plain-CNN baselines: the net, its config, the two-CNN threshold, storage, evaluation, training."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.evaluation.two_cnn import baseline_arrays, evaluate_baselines, two_cnn_threshold
from pipeline.models.modules import NO_ARCH
from pipeline.params.config import CalibrateConfig, ConfidenceConfig, ConfigError
from pipeline.routing.calibration import NEVER
from pipeline.search.space import Arch
from pipeline.train.baselines import (
    LARGE,
    SMALL,
    TWO_CNN,
    BaselineConfig,
    Baselines,
    BaselinesMeta,
    PlainCNN,
    load_baselines,
    plain_macs,
    plain_outputs,
    save_baselines,
    teacher_probabilities,
    train_baseline,
)

MEAN, STD = (0.4,), (0.3,)


def random_data(n: int = 64, shape: tuple[int, int, int] = (1, 16, 16), classes: int = 4,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Images (n, C, H, W) uint8 whose class is the brightest quadrant: learnable, but cheap."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    images = rng.integers(0, 80, (n, *shape)).astype(np.uint8)
    _, h, w = shape
    for i, y in enumerate(labels):
        r, c = divmod(int(y) % 4, 2)
        images[i, :, r * h // 2:(r + 1) * h // 2, c * w // 2:(c + 1) * w // 2] += 150
    return images, labels.astype(np.int64)


def stirred(width: int, seed: int, in_channels: int = 1, classes: int = 4) -> PlainCNN:
    """An untrained net with non-default weights and BatchNorm statistics."""
    torch.manual_seed(seed)
    net = PlainCNN(width, in_channels, classes)
    images, _ = random_data(32, (in_channels, 16, 16), classes, seed)
    with torch.no_grad():
        net.train()(torch.from_numpy(images).float() / 255.0)
    return net.eval()


def make_meta(small: PlainCNN, large: PlainCNN, threshold: float = 0.5,
              shape: tuple[int, int, int] = (1, 16, 16)) -> BaselinesMeta:
    return BaselinesMeta(small.width, large.width, small.in_channels, small.num_classes, shape, MEAN, STD,
                         plain_macs(small, shape), plain_macs(large, shape), threshold, "maxprob",
                         calib={"delta": 0.0})


# ----------------------------------------------------------------------------------------- net


def test_plain_cnn_shapes_and_surface() -> None:
    net = PlainCNN(4, 3, 10)
    features, logits = net(torch.zeros(5, 3, 16, 16))
    assert features.shape == (5, 16) and logits.shape == (5, 10)  # 4w pooled features
    assert net.default_arch() == NO_ARCH and net.space.size() == 1
    _, odd = net(torch.zeros(2, 3, 7, 9), NO_ARCH)  # floors through both pools
    assert odd.shape == (2, 10)
    with pytest.raises(ValueError):
        net(torch.zeros(1, 3, 16, 16), Arch((("op@l1", "conv3"),)))
    with pytest.raises(ValueError, match="PlainCNN.width"):
        PlainCNN(0, 1, 10)


def test_teacher_probabilities_are_flip_averaged_softmax_at_the_temperature() -> None:
    torch.manual_seed(0)
    net = PlainCNN(4, 1, 10).eval()
    images = np.random.default_rng(0).integers(0, 256, size=(6, 1, 12, 12), dtype=np.uint8)
    soft = teacher_probabilities(net, images, (0.3,), (0.2,), temperature=2.0)
    assert soft.shape == (6, 10) and soft.dtype == np.float32
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, atol=1e-6)
    mirrored = teacher_probabilities(net, images[..., ::-1], (0.3,), (0.2,), temperature=2.0)
    np.testing.assert_allclose(soft, mirrored, atol=1e-6)  # the target does not depend on the flip
    x = (torch.from_numpy(images).float() / 255 - 0.3) / 0.2
    with torch.no_grad():
        views = [torch.softmax(net(v)[1] / 2.0, dim=-1) for v in (x, x.flip(-1))]
    np.testing.assert_allclose(soft, ((views[0] + views[1]) / 2).numpy(), atol=1e-5)
    sharper = teacher_probabilities(net, images, (0.3,), (0.2,), temperature=0.5)
    assert sharper.max(axis=1).mean() > soft.max(axis=1).mean()
    with pytest.raises(ValueError, match="temperature"):
        teacher_probabilities(net, images, (0.3,), (0.2,), temperature=0.0)


def test_plain_cnn_macs_match_hand_count() -> None:
    # w=2, C=1, 16x16, K=10: 16*16*(2*1 + 2*2)*9 + 8*8*(4*2 + 4*4)*9 + 4*4*(8*4)*9 + 8*10
    assert 256 * 6 * 9 + 64 * 24 * 9 + 16 * 32 * 9 + 80 == 32336
    assert plain_macs(PlainCNN(2, 1, 10), (1, 16, 16)) == 32336
    # w=2, C=1, 7x7 (pools floor to 3x3, 1x1), K=3
    assert plain_macs(PlainCNN(2, 1, 3), (1, 7, 7)) == 49 * 6 * 9 + 9 * 24 * 9 + 1 * 32 * 9 + 8 * 3 == 4902
    assert plain_macs(PlainCNN(4, 1, 10), (1, 16, 16)) > 3 * plain_macs(PlainCNN(2, 1, 10), (1, 16, 16))


# ----------------------------------------------------------------------------------------- config


def test_config_defaults_and_train_config() -> None:
    assert BaselineConfig.from_dict(None) == BaselineConfig.from_dict({}) == BaselineConfig()
    cfg = BaselineConfig.from_dict({"small_width": 4, "large_width": 8, "epochs": 2, "lr": 1, "flip": False})
    assert (cfg.small_width, cfg.large_width, cfg.epochs, cfg.flip) == (4, 8, 2, False)
    assert isinstance(cfg.lr, float) and cfg.lr == 1.0
    train = cfg.train_config(7)
    assert (train.lam, train.mu, train.seed, train.epochs) == (0.0, 0.0, 7, 2)
    assert (train.lr, train.flip) == (1.0, False)
    assert (train.crop_padding, train.warmup_epochs, train.schedule) == (2, 0.2, "cosine")
    assert train.grad_clip == 0.0
    clipped = BaselineConfig.from_dict({"grad_clip": 1}).train_config(0)
    assert isinstance(clipped.grad_clip, float) and clipped.grad_clip == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.epochs = 3  # type: ignore[misc]


def test_config_rejects_unknown_keys_naming_them() -> None:
    with pytest.raises(ConfigError,
                       match=r"baselines.widht is not a known key(.|\n)*baselines.lam is not a known key"):
        BaselineConfig.from_dict({"widht": 4, "lam": 0.5, "epochs": 2})
    with pytest.raises(ConfigError, match="baselines must be a mapping"):
        BaselineConfig.from_dict([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(("key", "value"), [
    ("small_width", 0), ("small_width", 2.5), ("large_width", 4), ("epochs", 0), ("epochs", True),
    ("batch_size", -1), ("lr", 0), ("lr", "0.1"), ("momentum", 1.0), ("weight_decay", -1e-4),
    ("schedule", "linear"), ("warmup_epochs", 12), ("crop_padding", -1), ("flip", "yes"),
    ("label_smoothing", 1.0), ("lr", float("nan")), ("grad_clip", -1.0),
])
def test_config_rejects_bad_values_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"params: baselines\.{key} must be"):
        BaselineConfig.from_dict({"small_width": 8, "large_width": 24, key: value})


def test_the_chain_reads_the_cascade_rule_through_its_typed_configs() -> None:
    """The two-CNN chain is calibrated by calibrate's settings and model.confidence, the schema's defaults
    where absent (pipeline.workflows.baselines)."""
    cal = CalibrateConfig.from_params({"calibrate": {"delta": 0, "grid": 7, "reference": "last", "bound_z": 1.5,
                                                     "held_out": "calib"}})
    assert (cal.delta, cal.grid, cal.bound_z, cal.held_out) == (0.0, 7, 1.5, "calib") and isinstance(cal.delta, float)
    assert ConfidenceConfig.from_params({"model": {"confidence": "margin"}}).confidence == "margin"
    assert ConfidenceConfig.from_params({}).confidence == "maxprob"


def test_the_chain_settings_refuse_bad_values_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"calibrate\.delta must be in \[0, 1\), got -1"):
        CalibrateConfig.from_params({"calibrate": {"delta": -1}})
    with pytest.raises(ConfigError, match=r"model\.confidence must be one of"):
        ConfidenceConfig.from_params({"model": {"confidence": "entropy"}})


# ----------------------------------------------------------------------------------------- threshold


def test_two_cnn_threshold_exits_confident_right_images_early() -> None:
    # 70 images: small net confident and right; 30: unsure, right on 10; the large net is always right.
    conf = np.array([0.95] * 70 + [0.40] * 30, dtype=np.float32)
    right_small = np.array([True] * 70 + [True] * 10 + [False] * 20)
    right_large = np.ones(100, dtype=bool)
    threshold = two_cnn_threshold(conf, right_small, right_large, 100, 900, delta=0.0, grid=50)
    assert 0.40 < threshold <= 0.95
    leave = conf >= threshold
    accuracy = np.where(leave, right_small, right_large).mean()
    mean_macs = np.where(leave, 100, 1000).mean()
    assert accuracy >= right_large.mean() - 0.0  # within delta of always running both
    assert mean_macs == pytest.approx(0.7 * 100 + 0.3 * 1000) and mean_macs < 1000


def test_two_cnn_threshold_never_exits_when_confident_and_wrong() -> None:
    conf = np.full(100, 0.9, dtype=np.float32)
    right_small = np.arange(100) % 2 == 0  # confident but wrong on half
    threshold = two_cnn_threshold(conf, right_small, np.ones(100, dtype=bool), 100, 900, delta=0.01)
    assert threshold == NEVER
    # with a delta that tolerates the loss (the point estimate, z = 0), everything leaves at the small net
    assert two_cnn_threshold(conf, right_small, np.ones(100, dtype=bool), 100, 900, delta=0.5, z=0.0) <= 0.9


def test_two_cnn_threshold_checks_shapes() -> None:
    with pytest.raises(ValueError, match="share one shape"):
        two_cnn_threshold(np.ones(5), np.ones(4, dtype=bool), np.ones(5, dtype=bool), 1, 2, 0.0)


# ----------------------------------------------------------------------------------------- storage


def test_save_load_round_trip_gives_same_outputs(tmp_path: Path) -> None:
    small, large = stirred(2, 1), stirred(3, 2)
    meta = make_meta(small, large, threshold=0.61)
    save_baselines(tmp_path / "b", small, large, meta)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["baselines.json", "plain_large.pt",
                                                                  "plain_small.pt"]
    loaded = load_baselines(tmp_path / "b")
    assert loaded.meta == meta and not loaded.small.training and not loaded.large.training
    images, _ = random_data(20)
    for before, after in ((small, loaded.small), (large, loaded.large)):
        logits_a, conf_a = plain_outputs(before, images, MEAN, STD)
        logits_b, conf_b = plain_outputs(after, images, MEAN, STD)
        assert torch.equal(logits_a, logits_b) and torch.equal(conf_a, conf_b)
    record = json.loads((tmp_path / "b" / "baselines.json").read_text())
    assert record["threshold"] == 0.61 and record["macs_small"] == meta.macs_small
    assert record["image_shape"] == [1, 16, 16]


def test_save_refuses_a_net_that_does_not_match_its_record(tmp_path: Path) -> None:
    small, large = stirred(2, 1), stirred(3, 2)
    with pytest.raises(ValueError, match="plain_large"):
        save_baselines(tmp_path, small, large, make_meta(small, stirred(4, 3)))


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    small, large = stirred(2, 1), stirred(3, 2)
    with pytest.raises(FileNotFoundError, match="baselines.json"):
        load_baselines(tmp_path)
    save_baselines(tmp_path, small, large, make_meta(small, large))
    (tmp_path / "plain_large.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="plain_large.pt"):
        load_baselines(tmp_path)
    (tmp_path / "plain_large.pt").unlink()
    with pytest.raises(FileNotFoundError, match="plain_large.pt"):
        load_baselines(tmp_path)
    torch.save(small.state_dict(), tmp_path / "plain_large.pt")  # width 2 weights for the width-3 net
    with pytest.raises(ValueError, match="plain_large.pt"):
        load_baselines(tmp_path)
    (tmp_path / "baselines.json").write_text("{truncated")
    with pytest.raises(ValueError, match="baselines.json"):
        load_baselines(tmp_path)
    record = make_meta(small, large).to_json()
    del record["threshold"]
    (tmp_path / "baselines.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="baselines.json.*threshold"):
        load_baselines(tmp_path)


# ----------------------------------------------------------------------------------------- evaluation


def test_evaluate_baselines_keys_and_figures(tmp_path: Path) -> None:
    small, large = stirred(2, 1), stirred(3, 2)
    images, labels = random_data(40, seed=5)
    meta = make_meta(small, large, threshold=0.0)  # every image leaves at the small net
    save_baselines(tmp_path, small, large, meta)
    result = evaluate_baselines(tmp_path, images, labels)
    assert set(result) == {SMALL, LARGE, TWO_CNN}
    assert set(result[SMALL]) == set(result[LARGE]) == {"accuracy", "mean_macs"}
    assert set(result[TWO_CNN]) == {"accuracy", "mean_macs", "threshold", "small_exit_share"}
    logits, _ = plain_outputs(small, images, MEAN, STD)
    assert result[SMALL]["accuracy"] == pytest.approx(float((logits.argmax(-1).numpy() == labels).mean()))
    assert result[SMALL]["mean_macs"] == meta.macs_small and result[LARGE]["mean_macs"] == meta.macs_large
    assert result[TWO_CNN]["small_exit_share"] == 1.0
    assert result[TWO_CNN]["mean_macs"] == meta.macs_small
    assert result[TWO_CNN]["accuracy"] == result[SMALL]["accuracy"]
    loaded = Baselines(small, large, dataclasses.replace(meta, threshold=NEVER))
    never = evaluate_baselines(loaded, images, labels)
    assert never[TWO_CNN]["small_exit_share"] == 0.0
    assert never[TWO_CNN]["mean_macs"] == meta.macs_small + meta.macs_large
    assert never[TWO_CNN]["accuracy"] == never[LARGE]["accuracy"]
    with pytest.raises(ValueError, match="images must be"):
        evaluate_baselines(tmp_path, images[:, :, :8], labels)


def test_baseline_arrays_are_the_chain_as_two_exits(tmp_path: Path) -> None:
    small, large = stirred(2, 1), stirred(3, 2)
    meta = make_meta(small, large)
    save_baselines(tmp_path, small, large, meta)
    images, labels = random_data(30, seed=6)
    conf, correct, cum = baseline_arrays(tmp_path, images, labels)
    assert conf.shape == correct.shape == cum.shape == (30, 2)
    assert (cum[:, 0] == meta.macs_small).all() and (cum[:, 1] == meta.macs_small + meta.macs_large).all()


# ----------------------------------------------------------------------------------------- training


def test_training_is_deterministic_and_leaves_global_rng_alone() -> None:
    images, labels = random_data(64, seed=3)
    cfg = BaselineConfig(small_width=2, large_width=2, epochs=2, batch_size=16, warmup_epochs=0.0)
    torch.manual_seed(1)
    state = torch.get_rng_state()
    a = train_baseline(2, images, labels, MEAN, STD, 4, cfg, seed=11, progress=False)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's RNG is untouched
    torch.manual_seed(2)  # the seed argument alone decides the weights, not the caller's RNG
    b = train_baseline(2, images, labels, MEAN, STD, 4, cfg, seed=11, progress=False)
    c = train_baseline(2, images, labels, MEAN, STD, 4, cfg, seed=12, progress=False)
    assert not a.training and isinstance(a, PlainCNN)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        untrained = PlainCNN(2, 1, 4)
    assert not torch.equal(sa["fc.weight"], untrained.state_dict()["fc.weight"])  # it did train


def test_training_calls_on_epoch_and_checks_images() -> None:
    images, labels = random_data(32, seed=4)
    cfg = BaselineConfig(small_width=2, large_width=2, epochs=2, batch_size=16, warmup_epochs=0.0)
    seen: list[int] = []
    train_baseline(2, images, labels, MEAN, STD, 4, cfg, seed=0, progress=False,
                   on_epoch=lambda epoch, record, *_: seen.append(epoch))
    assert seen == [1, 2]
    with pytest.raises(ValueError, match="uint8"):
        train_baseline(2, images.astype(np.float32), labels, MEAN, STD, 4, cfg, seed=0, progress=False)


def test_a_baseline_by_name_with_its_macs() -> None:
    small, large = stirred(2, 1), stirred(3, 2)
    b = Baselines(small, large, make_meta(small, large))
    assert b.by_name(SMALL) == (small, b.meta.macs_small) and b.by_name(LARGE) == (large, b.meta.macs_large)
    with pytest.raises(ValueError, match="no plain CNN called 'two_cnn_cascade'"):
        b.by_name(TWO_CNN)


@pytest.mark.parametrize(("small_acc", "large_acc", "teacher"),
                         [(0.90, 0.93, LARGE), (0.93, 0.93, LARGE), (0.948, 0.427, SMALL)])
def test_the_teacher_is_the_net_more_accurate_on_calib(small_acc, large_acc, teacher) -> None:
    """plain_large teaches unless plain_small reads more on calib (a large net stuck on its plateau:
    docs/DESIGN.md "Your own data"); a tie keeps plain_large."""
    small, large = stirred(2, 1), stirred(3, 2)
    calib = {"delta": 0.0, SMALL: {"calib_accuracy": small_acc}, LARGE: {"calib_accuracy": large_acc}}
    b = Baselines(small, large, dataclasses.replace(make_meta(small, large), calib=calib))
    name, net, why = b.teacher()
    assert name == teacher and net is b.by_name(teacher)[0]
    assert f"calib accuracy {max(small_acc, large_acc):.4f}" in why
