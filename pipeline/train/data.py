"""Batches of uint8 images as normalised float tensors, with seeded, vectorised augmentation.

No DataLoader workers: the images are small and already in memory, so a batch is one gather, one
crop, one flip, one erasing and one normalisation, each a single tensor op. Every random draw comes from a
``torch.Generator`` seeded by ``(seed, epoch)``, so an epoch's order and augmentation can be
replayed exactly, and no global RNG state is read or changed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.device import fits_on_device


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed per (seed, epoch): neighbouring epochs get unrelated streams."""
    state = np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint64)[0]
    return int(state) & (2**63 - 1)


def random_crop(x: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """Zero-pad by ``padding`` then crop back to (H, W) at a random offset per image (0: no-op).

    Padding happens on the raw image, so the border is black (value 0), as torchvision's RandomCrop.
    """
    if padding == 0:
        return x
    b, c, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))  # (B, C, H + 2p, W + 2p)
    dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator)  # (B,)
    dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator)  # (B,)
    rows = (dy[:, None] + torch.arange(h)).to(x.device)  # (B, H)
    cols = (dx[:, None] + torch.arange(w)).to(x.device)  # (B, W)
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    chan = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chan, rows[:, None, :, None], cols[:, None, None, :]]  # (B, C, H, W)


def random_flip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mirror each image left-right with probability 1/2."""
    flip = (torch.rand(x.shape[0], generator=generator) < 0.5).to(x.device)  # (B,)
    return torch.where(flip[:, None, None, None], x.flip(-1), x)  # (B, C, H, W)


ERASE_AREA = (0.02, 0.25)  # share of the image one erased rectangle covers (Zhong et al.'s range, capped)
ERASE_ASPECT = (0.3, 3.3)  # its height / width, drawn log-uniformly


def random_erase(x: torch.Tensor, prob: float, generator: torch.Generator) -> torch.Tensor:
    """Random erasing (Zhong et al. 2020): with probability ``prob`` per image, set one rectangle of
    random area (``ERASE_AREA`` of the image) and aspect (``ERASE_ASPECT``) at a random place to 0, the
    black background of the raw image (0: no-op, and no random draw, so older runs replay exactly)."""
    if prob == 0:
        return x
    b, _, h, w = x.shape
    hit = torch.rand(b, generator=generator) < prob  # (B,)
    area = torch.empty(b).uniform_(*ERASE_AREA, generator=generator) * (h * w)  # (B,)
    log_aspect = torch.empty(b).uniform_(*np.log(ERASE_ASPECT).tolist(), generator=generator)  # (B,)
    eh = (area * log_aspect.exp()).sqrt().round().clamp(1, h).long()  # (B,)
    ew = (area / log_aspect.exp()).sqrt().round().clamp(1, w).long()  # (B,)
    y0 = (torch.rand(b, generator=generator) * (h - eh + 1)).long()  # (B,) in [0, h - eh]
    x0 = (torch.rand(b, generator=generator) * (w - ew + 1)).long()  # (B,) in [0, w - ew]
    rows, cols = torch.arange(h), torch.arange(w)
    in_rows = (rows[None, :] >= y0[:, None]) & (rows[None, :] < (y0 + eh)[:, None])  # (B, H)
    in_cols = (cols[None, :] >= x0[:, None]) & (cols[None, :] < (x0 + ew)[:, None])  # (B, W)
    mask = (hit[:, None, None] & in_rows[:, :, None] & in_cols[:, None, :]).to(x.device)  # (B, H, W)
    return x.masked_fill(mask[:, None], 0)  # (B, C, H, W)


def _channel_stats(values: Sequence[float] | float, channels: int, name: str) -> torch.Tensor:
    """Per-channel mean or std as (1, C, 1, 1); one value is used for every channel."""
    t = torch.as_tensor(values, dtype=torch.float32).reshape(-1)
    if t.numel() not in (1, channels):
        raise ValueError(f"{name} needs 1 or {channels} values, got {t.numel()}")
    if not torch.isfinite(t).all() or (name == "std" and bool((t <= 0).any())):
        raise ValueError(f"{name} must be finite (and > 0 for std), got {t.tolist()}")
    return t.expand(channels).reshape(1, channels, 1, 1).clone()


class ImageBatches:
    """Epochs of ``(x, y)`` batches: x (B, C, H, W) float, ``(x / 255 - mean) / std``; y (B,) int64.

    ``shuffle``, ``crop_padding``, ``flip`` and ``erase`` are for training; with all of them off (the default)
    the batches are the images in order, as evaluation needs. ``drop_last`` drops a final partial
    batch (small batches give noisy BatchNorm statistics) unless it is the only batch.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        batch_size: int,
        *,
        mean: Sequence[float] | float = 0.0,
        std: Sequence[float] | float = 1.0,
        shuffle: bool = False,
        crop_padding: int = 0,
        flip: bool = False,
        erase: float = 0.0,
        drop_last: bool = False,
        seed: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        if images.ndim != 4 or images.dtype != np.uint8:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {images.shape}")
        if labels.ndim != 1 or len(labels) != len(images):
            raise ValueError(f"labels must be (N,) = ({len(images)},), got {labels.shape}")
        if len(images) == 0:
            raise ValueError("no images to batch")
        if batch_size < 1 or crop_padding < 0:
            raise ValueError(f"need batch_size >= 1 and crop_padding >= 0, got {batch_size}, {crop_padding}")
        if not 0 <= erase <= 1:
            raise ValueError(f"erase is a probability in [0, 1], got {erase}")
        # from_numpy shares memory (no copy); batches are gathered copies, so the array is never written.
        self.images = torch.from_numpy(np.ascontiguousarray(images))  # (N, C, H, W) uint8
        self.labels = torch.from_numpy(np.asarray(labels, dtype=np.int64))  # (N,)
        self.batch_size = batch_size
        self.shuffle, self.crop_padding, self.flip, self.erase = shuffle, crop_padding, flip, erase
        self.drop_last = drop_last
        self.seed = seed
        self.device = torch.device(device)
        if self.device.type == "cuda" and fits_on_device(self.images.numel(), self.device):
            # uint8 images stay on the GPU (a quarter of float32): a batch is then a gather there,
            # with no host-to-device copy per step; the random draws stay on the CPU generator.
            self.images, self.labels = self.images.to(self.device), self.labels.to(self.device)
        channels = images.shape[1]
        self.mean = _channel_stats(mean, channels, "mean").to(self.device)  # (1, C, 1, 1)
        self.std = _channel_stats(std, channels, "std").to(self.device)  # (1, C, 1, 1)

    def __len__(self) -> int:
        n = len(self.labels)
        full, rest = divmod(n, self.batch_size)
        return full if (self.drop_last and full > 0) else full + (rest > 0)

    @property
    def num_images(self) -> int:
        """Images one epoch yields (fewer than N when the last partial batch is dropped)."""
        return min(len(self.labels), len(self) * self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.epoch(0)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of one epoch; the same (seed, epoch) always gives the same batches."""
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        n = len(self.labels)
        order = torch.randperm(n, generator=generator) if self.shuffle else torch.arange(n)
        for i in range(len(self)):
            index = order[i * self.batch_size:(i + 1) * self.batch_size].to(self.images.device)  # (B,)
            x = self.images[index]  # (B, C, H, W) uint8: augment before the 4x larger float copy
            x = random_crop(x, self.crop_padding, generator)
            if self.flip:
                x = random_flip(x, generator)
            x = random_erase(x, self.erase, generator)
            x = x.to(self.device, non_blocking=True).float().div_(255.0)  # (B, C, H, W)
            x = x.sub_(self.mean).div_(self.std)  # (B, C, H, W)
            yield x, self.labels[index].to(self.device, non_blocking=True)  # (B, C, H, W), (B,)
