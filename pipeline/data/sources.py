"""Image sources: MNIST-format IDX files (Fashion-MNIST from the Debian package by default), a
folder of images with one sub-folder per class, and scikit-learn's bundled digits.

Each source returns a :class:`RawDataset`: a ``train`` and a ``test`` part (uint8 ``(N, C, H, W)``),
class names, and stable ids. Splitting into train/route/calib happens in :mod:`pipeline.data.splits`.
"""

from __future__ import annotations

import gzip
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.io import Split

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DataError(ValueError):
    """Bad input data; the message names the offending file or item."""


@dataclass(frozen=True)
class RawDataset:
    train: Split
    test: Split | None
    classes: tuple[str, ...]
    source: str


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Parse an IDX file (optionally gzipped), checking magic, dimensions and length."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"IDX file {path} does not exist") from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"IDX file {path} is corrupt or truncated (gzip: {exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataError(f"IDX file {path} has a bad magic number {raw[:4].hex()!r}")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise DataError(f"IDX file {path} has a truncated header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(f"IDX file {path} is truncated or garbled: header says shape {shape} "
                        f"({expected} bytes of data), file holds {len(raw) - header}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def _find_idx(directory: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (directory / name).exists():
            return directory / name
    raise DataError(f"no IDX file {stem}[.gz] in {directory} (for Fashion-MNIST, install the Debian "
                    "package dataset-fashion-mnist: `make setup`)")


def _idx_split(directory: Path, prefix: str, name: str, classes: tuple[str, ...]) -> Split:
    images_path = _find_idx(directory, f"{prefix}-images-idx3-ubyte")
    labels_path = _find_idx(directory, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(images_path)
    labels = read_idx(labels_path).astype(np.int64)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise DataError(f"IDX file {images_path}: expected uint8 images (N, H, W), got {images.dtype} {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataError(f"IDX files {images_path} and {labels_path} disagree: {len(images)} images, "
                        f"labels of shape {labels.shape}")
    bad = np.flatnonzero((labels < 0) | (labels >= len(classes)))
    if len(bad):
        raise DataError(f"IDX file {labels_path}: {len(bad)} labels outside the class set 0..{len(classes) - 1}, "
                        f"e.g. index {bad[0]} has label {labels[bad[0]]}")
    ids = np.array([f"{name}-{i:05d}" for i in range(len(images))])
    return Split(name, images[:, None, :, :].copy(), labels, ids)


def load_idx_dir(directory: str | os.PathLike[str], classes: tuple[str, ...] | None = None) -> RawDataset:
    """A directory holding ``train-*`` and ``t10k-*`` IDX files (as MNIST and Fashion-MNIST ship)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"IDX directory {directory} does not exist")
    if classes is None:
        labels = read_idx(_find_idx(directory, "train-labels-idx1-ubyte"))
        classes = tuple(str(i) for i in range(int(labels.max()) + 1))
    train = _idx_split(directory, "train", "train", classes)
    test = _idx_split(directory, "t10k", "test", classes)
    return RawDataset(train, test, classes, f"idx:{directory}")


def load_fashion_mnist(directory: str | os.PathLike[str] = FASHION_MNIST_DIR) -> RawDataset:
    data = load_idx_dir(directory, FASHION_MNIST_CLASSES)
    return RawDataset(data.train, data.test, data.classes, "fashion-mnist")


def load_digits(image_size: int) -> RawDataset:
    """scikit-learn's bundled 8x8 digits (1797 images), rescaled to 0..255 and resized."""
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    images = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)[:, None]  # (N, 1, 8, 8)
    images = resize_batch(images, image_size)
    ids = np.array([f"digits-{i:04d}" for i in range(len(images))])
    train = Split("train", images, bunch.target.astype(np.int64), ids)
    return RawDataset(train, None, tuple(str(c) for c in bunch.target_names), "digits")


def resize_batch(images: np.ndarray, size: int) -> np.ndarray:
    """Resize uint8 ``(N, C, H, W)`` images to ``size`` x ``size`` (bilinear, antialiased)."""
    if images.shape[-2:] == (size, size):
        return images
    import torch
    from torchvision.transforms.v2 import functional as F

    resized = F.resize(torch.from_numpy(images), [size, size], antialias=True)  # (N, C, size, size)
    return resized.numpy()


def decode_image_file(path: str | os.PathLike[str], channels: int, size: int) -> np.ndarray:
    """Decode one PNG/JPEG of any size or mode to uint8 ``(channels, size, size)``."""
    import torch

    with warnings.catch_warnings():  # torchvision 0.29 flags its decoders as deprecated in favour of torchcodec
        warnings.simplefilter("ignore", DeprecationWarning)
        from torchvision.io import ImageReadMode, decode_image

    mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
    try:
        data = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            image = decode_image(data, mode=mode)  # (C, H, W)
    except (RuntimeError, ValueError, OSError) as exc:
        raise DataError(f"image file {path} cannot be decoded: {str(exc).splitlines()[0]}") from None
    return resize_batch(image.numpy()[None], size)[0]


def load_imagefolder(directory: str | os.PathLike[str], channels: int, image_size: int) -> RawDataset:
    """One sub-folder per class; every PNG/JPEG inside is decoded, converted and resized."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"image folder {directory} does not exist")
    class_dirs = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(class_dirs) < 2:
        raise DataError(f"image folder {directory} needs at least two class sub-folders, found {len(class_dirs)}")
    images, labels, ids = [], [], []
    for label, class_dir in enumerate(class_dirs):
        files = sorted(p for p in class_dir.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise DataError(f"class folder {class_dir} holds no PNG/JPEG images")
        for file in files:
            images.append(decode_image_file(file, channels, image_size))
            labels.append(label)
            ids.append(file.relative_to(directory).as_posix())
    train = Split("train", np.stack(images), np.array(labels, dtype=np.int64), np.array(ids))
    return RawDataset(train, None, tuple(p.name for p in class_dirs), f"imagefolder:{directory}")


def load_source(source: str, *, channels: int, image_size: int) -> RawDataset:
    """Dispatch on the ``ingest.source`` param: ``fashion-mnist``, ``idx:<dir>``, ``imagefolder:<dir>``, ``digits``."""
    if source == "fashion-mnist":
        data = load_fashion_mnist()
    elif source.startswith("fashion-mnist:") or source.startswith("idx:"):
        directory = source.split(":", 1)[1]
        data = load_fashion_mnist(directory) if source.startswith("fashion") else load_idx_dir(directory)
    elif source.startswith("imagefolder:"):
        return load_imagefolder(source.split(":", 1)[1], channels, image_size)
    elif source == "digits":
        return load_digits(image_size)
    else:
        raise DataError(f"unknown data source {source!r}; use fashion-mnist, idx:<dir>, imagefolder:<dir> or digits")
    if data.train.images.shape[-1] != image_size:
        data = RawDataset(_resized(data.train, image_size), data.test and _resized(data.test, image_size),
                          data.classes, data.source)
    return data


def _resized(split: Split, size: int) -> Split:
    return Split(split.name, resize_batch(split.images, size), split.labels, split.ids)
