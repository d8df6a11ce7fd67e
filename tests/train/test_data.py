"""Tests of pipeline.train.data beyond test_loop's: ``epoch_seed``, ``random_flip``, the no-op cases of
``random_crop`` and ``random_erase`` (no random draw), erasing across channels, per-channel
normalisation and its checks, ``ImageBatches``' input checks, ``len`` / ``num_images``, shuffling (every
image once, labels kept with their images), augmentation on the raw image, and no global RNG use."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.train.data import (
    ERASE_AREA,
    ERASE_ASPECT,
    ImageBatches,
    epoch_seed,
    random_crop,
    random_erase,
    random_flip,
)


def indexed(n: int, channels: int = 1, size: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Image i is filled with the value i (uint8), its label is i: order and pairing are visible."""
    images = np.broadcast_to(np.arange(n, dtype=np.uint8)[:, None, None, None], (n, channels, size, size))
    return np.ascontiguousarray(images), np.arange(n)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- epoch_seed ----------------------------------------------------------------------------------------


def test_epoch_seed_is_a_fixed_63_bit_seed_per_seed_and_epoch() -> None:
    seeds = {(s, e): epoch_seed(s, e) for s in range(4) for e in range(4)}
    assert all(type(v) is int and 0 <= v < 2**63 for v in seeds.values())
    assert len(set(seeds.values())) == len(seeds)  # (0, 1) and (1, 0) too
    assert epoch_seed(3, 2) == seeds[(3, 2)]
    assert epoch_seed(0, 0) != 0 and epoch_seed(0, 1) - epoch_seed(0, 0) not in (0, 1)


# --- augmentation functions -----------------------------------------------------------------------------


def test_random_flip_mirrors_about_half_the_images_whole() -> None:
    x = torch.arange(400 * 2 * 3 * 5, dtype=torch.float32).reshape(400, 2, 3, 5)  # (400, 2, 3, 5)
    out = random_flip(x, gen(1))
    same = (out == x).flatten(1).all(dim=1)  # (400,)
    mirrored = (out == x.flip(-1)).flatten(1).all(dim=1)  # (400,)
    assert bool((same ^ mirrored).all())  # each image (every channel) one or the other
    assert 0.4 < float(mirrored.float().mean()) < 0.6
    assert torch.equal(random_flip(x, gen(1)), out)
    assert not torch.equal(random_flip(x, gen(2)), out)


def test_random_crop_moves_every_channel_of_an_image_alike() -> None:
    x = torch.arange(1, 49, dtype=torch.uint8).reshape(1, 3, 4, 4).repeat(32, 1, 1, 1)  # (32, 3, 4, 4)
    out = random_crop(x, 1, gen(0))
    padded = torch.nn.functional.pad(x[0], (1, 1, 1, 1))  # (3, 6, 6)
    offsets = []
    for img in out:
        found = [(dy, dx) for dy in range(3) for dx in range(3)
                 if torch.equal(img, padded[:, dy:dy + 4, dx:dx + 4])]
        assert len(found) == 1
        offsets.append(found[0])
    assert any(dy != dx for dy, dx in offsets)  # rows and columns are shifted independently


def test_no_crop_and_no_erase_are_no_ops_that_draw_nothing() -> None:
    x = torch.randint(0, 255, (4, 1, 6, 6), dtype=torch.uint8)
    g = gen(5)
    state = g.get_state()
    assert random_crop(x, 0, g) is x
    assert random_erase(x, 0.0, g) is x
    assert torch.equal(g.get_state(), state)


def test_random_erase_at_probability_one_blanks_one_rectangle_in_every_channel() -> None:
    x = torch.full((64, 3, 32, 32), 200, dtype=torch.uint8)  # (64, 3, 32, 32)
    kept = x.clone()
    out = random_erase(x, 1.0, gen(3))
    assert out.dtype == torch.uint8 and torch.equal(x, kept)  # a new tensor: the input is not written
    zeros = out == 0  # (64, 3, 32, 32)
    assert bool((zeros[:, :1] == zeros).all())  # the same rectangle in every channel
    for img in zeros[:, 0]:
        rows, cols = img.any(dim=1).nonzero().flatten(), img.any(dim=0).nonzero().flatten()
        h, w = int(rows[-1] - rows[0] + 1), int(cols[-1] - cols[0] + 1)
        assert int(img.sum()) == h * w  # one solid rectangle, in every image
        assert ERASE_AREA[0] * 1024 / 2 <= h * w <= ERASE_AREA[1] * 1024 * 1.5
        assert ERASE_ASPECT[0] / 2 <= h / w <= ERASE_ASPECT[1] * 2  # its aspect (rounding, clamping aside)


# --- normalisation ----------------------------------------------------------------------------------------


def test_per_channel_mean_and_std_apply_to_their_channel() -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(5, 3, 4, 4)).astype(np.uint8)
    mean, std = (0.1, 0.5, 0.9), (0.5, 1.0, 2.0)
    x, _ = next(iter(ImageBatches(images, np.zeros(5, dtype=np.int64), 5, mean=mean, std=std)))
    raw = torch.from_numpy(images).float() / 255
    for c in range(3):
        assert torch.allclose(x[:, c], (raw[:, c] - mean[c]) / std[c], atol=1e-6)
    one, _ = next(iter(ImageBatches(images, np.zeros(5, dtype=np.int64), 5, mean=0.5, std=0.25)))
    assert torch.allclose(one, (raw - 0.5) / 0.25, atol=1e-6)  # one value: every channel


@pytest.mark.parametrize("kw,message", [
    ({"mean": (0.1, 0.2)}, "mean needs 1 or 3 values, got 2"),
    ({"std": (1.0, 1.0, 1.0, 1.0)}, "std needs 1 or 3 values, got 4"),
    ({"std": (1.0, 0.0, 1.0)}, r"std must be finite \(and > 0 for std\), got \[1.0, 0.0, 1.0\]"),
    ({"std": -1.0}, "std must be finite"),
    ({"mean": float("nan")}, "mean must be finite"),
    ({"std": float("inf")}, "std must be finite"),
])
def test_bad_normalisation_stats_are_refused(kw: dict, message: str) -> None:
    images, labels = indexed(2, channels=3)
    with pytest.raises(ValueError, match=message):
        ImageBatches(images, labels, 2, **kw)


def test_a_negative_mean_is_allowed() -> None:
    images, labels = indexed(2)
    x, _ = next(iter(ImageBatches(images, labels, 2, mean=-1.0)))
    assert torch.allclose(x, torch.from_numpy(images).float() / 255 + 1)


# --- ImageBatches checks ----------------------------------------------------------------------------------


BAD_SHAPE = r"images must be uint8 \(N, C, H, W\), got "


@pytest.mark.parametrize("images,labels,kw,message", [
    (np.zeros((2, 1, 4, 4), np.float32), np.zeros(2), {}, BAD_SHAPE + "float32"),
    (np.zeros((2, 4, 4), np.uint8), np.zeros(2), {}, BAD_SHAPE + r"uint8 \(2, 4, 4\)"),
    (np.zeros((2, 1, 4, 4), np.uint8), np.zeros(3), {}, r"labels must be \(N,\) = \(2,\), got \(3,\)"),
    (np.zeros((2, 1, 4, 4), np.uint8), np.zeros((2, 1)), {}, r"labels must be \(N,\)"),
    (np.zeros((0, 1, 4, 4), np.uint8), np.zeros(0), {}, "no images to batch"),
    (np.zeros((2, 1, 4, 4), np.uint8), np.zeros(2), {"batch_size": 0}, "need batch_size >= 1"),
    (np.zeros((2, 1, 4, 4), np.uint8), np.zeros(2), {"crop_padding": -1}, "crop_padding >= 0, got 2, -1"),
    (np.zeros((2, 1, 4, 4), np.uint8), np.zeros(2), {"erase": -0.1}, r"erase is a probability in \[0, 1\]"),
])
def test_bad_inputs_are_refused_with_the_reason(images: np.ndarray, labels: np.ndarray, kw: dict,
                                                message: str) -> None:
    kw = {"batch_size": 2, **kw}
    with pytest.raises(ValueError, match=message):
        ImageBatches(images, labels, **kw)


@pytest.mark.parametrize("n,batch_size,drop_last,length,num_images,sizes", [
    (10, 4, False, 3, 10, [4, 4, 2]),
    (10, 4, True, 2, 8, [4, 4]),
    (8, 4, True, 2, 8, [4, 4]),
    (3, 4, True, 1, 3, [3]),  # the only batch is kept, partial or not
    (3, 4, False, 1, 3, [3]),
    (5, 1, True, 5, 5, [1] * 5),
])
def test_length_and_images_per_epoch(n: int, batch_size: int, drop_last: bool, length: int, num_images: int,
                                     sizes: list[int]) -> None:
    images, labels = indexed(n)
    data = ImageBatches(images, labels, batch_size, drop_last=drop_last, shuffle=True)
    assert (len(data), data.num_images) == (length, num_images)
    assert [len(y) for _, y in data.epoch(3)] == sizes


# --- epochs -------------------------------------------------------------------------------------------------


def test_a_shuffled_epoch_is_every_image_once_with_its_label() -> None:
    images, labels = indexed(23)
    data = ImageBatches(images, labels.astype(np.int32), 5, shuffle=True, seed=4)
    orders = []
    for e in range(3):
        xs, ys = zip(*data.epoch(e), strict=True)
        x, y = torch.cat(xs), torch.cat(ys)  # (23, 1, 4, 4), (23,)
        assert y.dtype == torch.int64 and sorted(y.tolist()) == list(range(23))
        assert torch.allclose(x, (y.float() / 255)[:, None, None, None].expand_as(x))  # pairs kept
        orders.append(y.tolist())
    assert orders[0] != orders[1] != orders[2] and orders[0] != list(range(23))


def test_dropping_the_last_batch_of_a_shuffled_epoch_drops_different_images() -> None:
    images, labels = indexed(10)
    data = ImageBatches(images, labels, 4, shuffle=True, drop_last=True)
    seen = [{int(v) for _, y in data.epoch(e) for v in y} for e in range(6)]
    assert all(len(s) == 8 for s in seen) and len(set.union(*seen)) == 10


def test_iterating_is_epoch_zero() -> None:
    images, labels = indexed(9)
    data = ImageBatches(images, labels, 4, shuffle=True, flip=True, crop_padding=1, erase=0.5, seed=2)
    for (x, y), (x0, y0) in zip(data, data.epoch(0), strict=True):
        assert torch.equal(x, x0) and torch.equal(y, y0)


def test_augmentation_pads_and_erases_the_raw_image_with_black() -> None:
    images = np.full((64, 1, 8, 8), 255, dtype=np.uint8)
    mean, std = 0.5, 0.25
    black, white = (0 - mean) / std, (1 - mean) / std
    for kw in ({"crop_padding": 2}, {"erase": 1.0}):
        data = ImageBatches(images, np.zeros(64, dtype=np.int64), 16, mean=mean, std=std, **kw)
        x = torch.cat([x for x, _ in data])
        values = set(x.unique().tolist())
        assert values == {black, white}, kw


def test_epochs_use_no_global_random_state_and_leave_the_images_alone() -> None:
    images = np.random.default_rng(1).integers(0, 256, size=(12, 2, 6, 6)).astype(np.uint8)
    kept = images.copy()
    data = ImageBatches(images, np.arange(12), 5, shuffle=True, crop_padding=2, flip=True, erase=0.7, seed=9)

    def epoch() -> list[torch.Tensor]:
        return [x for x, _ in data.epoch(1)]

    torch.manual_seed(0)
    np.random.seed(0)
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    first = epoch()
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.array_equal(np.random.get_state()[1], np_state)
    torch.manual_seed(123)  # another global seed: the same batches
    assert all(torch.equal(a, b) for a, b in zip(first, epoch(), strict=True))
    np.testing.assert_array_equal(images, kept)


def test_non_contiguous_images_are_batched_as_given() -> None:
    images, labels = indexed(4, size=5)
    images = images.copy()
    images[:, :, :, 0] = 255
    mirrored = images[:, :, :, ::-1]  # negative strides
    x, _ = next(iter(ImageBatches(mirrored, labels, 4)))
    assert torch.allclose(x, torch.from_numpy(mirrored.copy()).float() / 255)
    assert bool((x[:, :, :, -1] == 1.0).all())
