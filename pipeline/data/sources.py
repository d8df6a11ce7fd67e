"""Image sources: MNIST-format IDX files (Fashion-MNIST from the Debian package by default), a
folder of images with one sub-folder per class, and scikit-learn's bundled digits.

Each source returns a :class:`RawDataset`: a ``train`` and a ``test`` part (uint8 ``(N, C, H, W)``),
class names, and stable ids. Splitting into train/route/calib happens in :mod:`pipeline.data.splits`.
"""

from __future__ import annotations

import gzip
import os
import unicodedata
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.io import Split
from pipeline.params.choices import ConfigError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
IDX_CLASSES_FILE = "classes.txt"  # in an `idx:` directory: one class name a line, line i naming label i
MNIST_FORMAT_CLASSES = 10  # labels an `idx:` source may use without a classes file: 0..9
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


def _check_labels(labels: np.ndarray, n_classes: int, labels_path: Path, hint: str = "") -> None:
    """Every label of an IDX labels file must be a class index 0..n_classes-1; the first that is not is
    named by its row index and value."""
    bad = np.flatnonzero((labels < 0) | (labels >= n_classes))
    if len(bad):
        raise DataError(f"IDX file {labels_path}: {len(bad)} labels outside the class set 0..{n_classes - 1}, "
                        f"e.g. index {bad[0]} has label {labels[bad[0]]}{hint}")


def _idx_split(directory: Path, prefix: str, name: str, classes: tuple[str, ...], hint: str = "") -> Split:
    images_path = _find_idx(directory, f"{prefix}-images-idx3-ubyte")
    labels_path = _find_idx(directory, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(images_path)
    labels = read_idx(labels_path).astype(np.int64)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise DataError(f"IDX file {images_path}: expected uint8 images (N, H, W), got {images.dtype} {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataError(f"IDX files {images_path} and {labels_path} disagree: {len(images)} images, "
                        f"labels of shape {labels.shape}")
    _check_labels(labels, len(classes), labels_path, hint)
    ids = np.array([f"{name}-{i:05d}" for i in range(len(images))])
    return Split(name, images[:, None, :, :].copy(), labels, ids)


def class_name(raw: str, where: str) -> str:
    """A class name as the model keeps it: Unicode NFC (so "café" typed two ways is one class), with
    no control character (a tab or newline would print raw in every table); ``where`` names its origin."""
    name = unicodedata.normalize("NFC", raw)
    bad = sorted({repr(ch) for ch in name if unicodedata.category(ch).startswith("C")})
    if bad:
        raise DataError(f"{where}: class name {name!r} holds control characters {', '.join(bad)}")
    return name


def read_idx_classes(path: Path) -> tuple[str, ...]:
    """The class names of an ``idx:`` directory's classes file: one a line (line i names label i),
    stripped; no blank or repeated name."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"classes file {path} cannot be read: {exc}") from None
    while lines and not lines[-1].strip():  # a trailing blank line is no class
        lines.pop()
    names = tuple(class_name(line.strip(), f"classes file {path}: line {i}") for i, line in enumerate(lines, 1))
    if not names:
        raise DataError(f"classes file {path} names no class (one class name a line, line i naming label i)")
    seen: dict[str, int] = {}
    for number, name in enumerate(names, 1):
        if not name:
            raise DataError(f"classes file {path}: line {number} is blank (one class name a line, line i "
                            "naming label i)")
        if name in seen:
            raise DataError(f"classes file {path}: line {number} repeats class {name!r} of line "
                            f"{seen[name]}")
        seen[name] = number
    return names


def load_idx_dir(directory: str | os.PathLike[str], classes: tuple[str, ...] | None = None) -> RawDataset:
    """A directory holding ``train-*`` and ``t10k-*`` IDX files (as MNIST and Fashion-MNIST ship).

    The class set is ``classes`` if given, else the names in ``<directory>/classes.txt`` (one a line,
    line i naming label i), else MNIST's: labels 0..9, named ``"0"``.. up to the largest training
    label. A label outside the class set (in either file) is an error naming the file, the row and the
    value; a class of the set with too few images is refused by the ingest stage."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"IDX directory {directory} does not exist")
    hint = ""
    if classes is None and (directory / IDX_CLASSES_FILE).exists():
        classes = read_idx_classes(directory / IDX_CLASSES_FILE)
        hint = f" (the classes listed in {directory / IDX_CLASSES_FILE})"
    elif classes is None:
        labels_path = _find_idx(directory, "train-labels-idx1-ubyte")
        labels = read_idx(labels_path)
        if labels.ndim != 1 or len(labels) == 0:
            raise DataError(f"IDX file {labels_path}: expected a non-empty list of labels, "
                            f"got shape {labels.shape}")
        hint = (f" (without {directory / IDX_CLASSES_FILE}, the classes of an IDX source are 0 up to its "
                "largest training label, at most 9 as in MNIST; for other classes list their names there, "
                "one a line, line i naming label i)")
        _check_labels(labels.astype(np.int64), MNIST_FORMAT_CLASSES, labels_path, hint)
        classes = tuple(str(i) for i in range(int(labels.max()) + 1))
    train = _idx_split(directory, "train", "train", classes, hint)
    test = _idx_split(directory, "t10k", "test", classes, hint)
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


def resize_batch(images: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    """Resize uint8 ``(N, C, H, W)`` images to ``size`` x ``size`` or ``(h, w)`` (bilinear, antialiased)."""
    hw = (int(size), int(size)) if np.ndim(size) == 0 else (int(size[0]), int(size[1]))
    if tuple(images.shape[-2:]) == hw:
        return images
    import torch
    from torchvision.transforms.v2 import functional as F

    batch = torch.from_numpy(np.ascontiguousarray(images))  # (N, C, H, W)
    return F.resize(batch, list(hw), antialias=True).numpy()  # (N, C, h, w)


# ------------------------------------------------------------------------------------------- decoding
# Every PNG/JPEG the project reads (ingest's image folders, `cascade recognize`, the served model's
# `image` column) goes through decode_image_bytes: size checked from the header before any pixel is
# decoded, any bit depth and mode converted to uint8 grey or RGB, then resized.

DEFAULT_MAX_PIXELS = 4096 * 4096  # width x height; `data.max_pixels`, `cascade recognize --max-pixels`
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff"
_BYTES_PER_PIXEL_BOUND = 9  # a 16-bit RGBA PNG stored uncompressed: 8 bytes a pixel, 1 filter byte a row
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # frame headers (not DHT, JPG, DAC)
_STANDALONE_MARKERS = frozenset(range(0xD0, 0xD8)) | {0x01, 0xD8}  # RSTn, TEM, SOI: no length field
_SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def max_file_bytes(max_pixels: int) -> int:
    """The largest file that can hold an image of ``max_pixels`` pixels (PNG stored uncompressed)."""
    return _BYTES_PER_PIXEL_BOUND * max_pixels + (1 << 20)


def image_header(data: bytes) -> tuple[str, int, int]:
    """``(format, width, height)`` of PNG or JPEG bytes, read from the PNG IHDR chunk or the first
    JPEG frame header (SOFn) without decoding any pixel; ValueError says what is wrong."""
    if data.startswith(PNG_SIGNATURE):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise ValueError("truncated PNG header (no IHDR chunk)")
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        return "PNG", width, height
    if data.startswith(JPEG_SIGNATURE):
        i, n = 2, len(data)
        while i < n:
            if data[i] != 0xFF:
                raise ValueError(f"corrupt JPEG header (no marker at byte {i})")
            while i < n and data[i] == 0xFF:  # fill bytes
                i += 1
            if i >= n:
                break
            marker = data[i]
            i += 1
            if marker in _STANDALONE_MARKERS:
                continue
            if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header came first
                raise ValueError("corrupt JPEG (no frame header before the image data)")
            if i + 2 > n:
                break
            length = int.from_bytes(data[i:i + 2], "big")
            if marker in _SOF_MARKERS:
                if i + 7 > n:
                    break
                height = int.from_bytes(data[i + 3:i + 5], "big")  # after length (2) and precision (1)
                width = int.from_bytes(data[i + 5:i + 7], "big")
                return "JPEG", width, height
            if length < 2:
                raise ValueError(f"corrupt JPEG header (segment length {length} at byte {i})")
            i += length
        raise ValueError("truncated JPEG header (no frame header)")
    raise ValueError(f"not a PNG or JPEG (it starts with {data[:8]!r})")


def _to_uint8(image: Any, channels: int) -> np.ndarray:
    """A loaded Pillow image of any mode -> uint8 ``(channels, H, W)``: 16-bit samples scaled to 8 bits
    (rounded), palettes expanded, alpha dropped, CMYK/YCbCr converted, grey from RGB by ITU-R 601 luma."""
    from PIL import Image

    if image.mode in _SIXTEEN_BIT_MODES:  # 16-bit grey: v -> round(v * 255 / 65535)
        wide = np.asarray(image).astype(np.int64)  # (H, W)
        image = Image.fromarray(((np.clip(wide, 0, 65535) + 128) // 257).astype(np.uint8), mode="L")
    target = "L" if channels == 1 else "RGB"
    if image.mode != target:
        image = image.convert(target)
    array = np.array(image, dtype=np.uint8)  # (H, W) or (H, W, 3); a writable copy (torch needs one)
    return np.ascontiguousarray(array[None] if array.ndim == 2 else array.transpose(2, 0, 1))  # (C, H, W)


def decode_image_bytes(data: bytes, channels: int, size: int | tuple[int, int], *,
                       max_pixels: int = DEFAULT_MAX_PIXELS, name: str = "image") -> np.ndarray:
    """PNG/JPEG bytes of any size, bit depth or mode -> uint8 ``(channels, size, size)`` (or ``(channels,
    h, w)``). An image over ``max_pixels`` (width x height, from the header) is refused before its
    pixels are decoded. Every failure is a :class:`DataError` whose message starts with ``name``."""
    import io

    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if not data:
        raise DataError(f"{name} is empty")
    try:
        fmt, width, height = image_header(data)
    except ValueError as exc:
        raise DataError(f"{name} cannot be decoded: {exc}") from None
    if width < 1 or height < 1:
        raise DataError(f"{name} cannot be decoded: its header says {width} x {height} pixels")
    if width * height > max_pixels:
        raise DataError(f"{name} is too large: {width} x {height} = {width * height:,} pixels, over the "
                        f"limit of {max_pixels:,} pixels")
    from PIL import JpegImagePlugin, PngImagePlugin

    opener = PngImagePlugin.PngImageFile if fmt == "PNG" else JpegImagePlugin.JpegImageFile
    try:
        with warnings.catch_warnings():  # Pillow's palette/transparency notes; our own size limit is checked
            warnings.simplefilter("ignore")
            with opener(io.BytesIO(data)) as image:  # constructed directly: the size was checked above
                if image.size != (width, height):
                    seen = " x ".join(map(str, image.size))
                    raise ValueError(f"its header says {width} x {height}, the decoder sees {seen}")
                image.load()
                array = _to_uint8(image, channels)  # (C, H, W)
    except MemoryError:
        raise DataError(f"{name} cannot be decoded: out of memory for {width} x {height} pixels") from None
    except Exception as exc:  # any decoder failure (truncated, corrupt, unsupported) is this input's fault
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{name} cannot be decoded: {reason}") from None
    return resize_batch(array[None], size)[0]


def decode_image_file(path: str | os.PathLike[str], channels: int, size: int | tuple[int, int], *,
                      max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode one PNG/JPEG file of any size, bit depth or mode to uint8 ``(channels, size, size)``; a
    :class:`DataError` naming the file if it is missing, empty, not a PNG/JPEG, corrupt or too large."""
    path = Path(path)
    name = f"image file {path}"
    try:
        nbytes = path.stat().st_size
        if nbytes > max_file_bytes(max_pixels):
            raise DataError(f"{name} is too large: {nbytes:,} bytes, more than any image of at most "
                            f"{max_pixels:,} pixels needs")
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{name} cannot be read: {exc.strerror or exc}") from None
    return decode_image_bytes(data, channels, size, max_pixels=max_pixels, name=name)


def _class_files(class_dir: Path) -> list[Path]:
    """The PNG/JPEG files of one class folder, sorted. A class folder holds images only, no sub-folder
    (hidden ones, such as ``.ipynb_checkpoints``, are skipped): nested classes are refused, not merged."""
    entries = sorted(class_dir.iterdir())
    nested = [p for p in entries if p.is_dir() and not p.name.startswith(".")]
    if nested:
        more = f" (and {len(nested) - 1} more)" if len(nested) > 1 else ""
        raise DataError(f"class folder {class_dir} holds a sub-folder {nested[0]}{more}: an image folder has "
                        "one level of class folders with the images directly inside; make each sub-folder a "
                        f"class folder of its own, or move its images up into {class_dir} to keep them one "
                        "class")
    files = [p for p in entries if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise DataError(f"class folder {class_dir} holds no PNG/JPEG images")
    return files


def load_imagefolder(directory: str | os.PathLike[str], channels: int, image_size: int, *,
                     max_pixels: int = DEFAULT_MAX_PIXELS) -> RawDataset:
    """One sub-folder per class, the images directly inside (a nested sub-folder is refused, named);
    every PNG/JPEG is decoded, converted and resized. The first file that cannot be (corrupt,
    truncated, empty, over ``max_pixels``) stops the load, named. The layout is checked in full before
    any image is decoded."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"image folder {directory} does not exist")
    class_dirs = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(class_dirs) < 2:
        raise DataError(f"image folder {directory} needs at least two class sub-folders, found {len(class_dirs)}")
    names = [class_name(p.name, f"image folder {p}") for p in class_dirs]
    twins = sorted({n for n in names if names.count(n) > 1})
    if twins:
        raise DataError(f"image folder {directory}: sub-folders {twins} differ only in their Unicode form "
                        "(NFC/NFD); rename one so each class is one folder")
    class_files = [_class_files(class_dir) for class_dir in class_dirs]
    images, labels, ids = [], [], []
    for label, files in enumerate(class_files):
        for file in files:
            images.append(decode_image_file(file, channels, image_size, max_pixels=max_pixels))
            labels.append(label)
            ids.append(file.relative_to(directory).as_posix())
    train = Split("train", np.stack(images), np.array(labels, dtype=np.int64), np.array(ids))
    return RawDataset(train, None, tuple(names), f"imagefolder:{directory}")


def check_source(source: str) -> None:
    """``data.source``: a folder source must exist before a 40-minute run is started on it."""
    kind, _, where = source.partition(":")
    if kind in ("imagefolder", "idx", "fashion-mnist") and where and not Path(where).is_dir():
        raise ConfigError(f"data source {source}: folder {where} does not exist")


def load_source(source: str, *, channels: int, image_size: int, max_pixels: int = DEFAULT_MAX_PIXELS
                ) -> RawDataset:
    """Dispatch on the ``data.source`` param: ``fashion-mnist``, ``idx:<dir>``, ``imagefolder:<dir>`` or
    ``digits``.
    ``max_pixels`` (``data.max_pixels``) bounds each PNG/JPEG of an image folder (width x height)."""
    if source == "fashion-mnist":
        data = load_fashion_mnist()
    elif source.startswith("fashion-mnist:") or source.startswith("idx:"):
        directory = source.split(":", 1)[1]
        data = load_fashion_mnist(directory) if source.startswith("fashion") else load_idx_dir(directory)
    elif source.startswith("imagefolder:"):
        return load_imagefolder(source.split(":", 1)[1], channels, image_size, max_pixels=max_pixels)
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
