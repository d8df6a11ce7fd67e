"""Image sources: MNIST-format IDX files (Fashion-MNIST from the Debian package by default), a
folder of images with one sub-folder per class, and scikit-learn's bundled digits.

Each source returns a :class:`RawDataset`: a ``train`` and a ``test`` part (uint8 ``(N, C, H, W)``),
class names, and stable ids. Splitting into train/route/calib happens in :mod:`pipeline.data.splits`.
"""

from __future__ import annotations

import gzip
import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.data.decode import DEFAULT_MAX_PIXELS as DEFAULT_MAX_PIXELS  # re-exported: readers import
from pipeline.data.decode import IMAGE_SUFFIXES as IMAGE_SUFFIXES  # the decoder's names from here
from pipeline.data.decode import DataError as DataError
from pipeline.data.decode import decode_image_bytes as decode_image_bytes
from pipeline.data.decode import decode_image_file as decode_image_file
from pipeline.data.decode import image_header as image_header
from pipeline.data.decode import is_image_file, resize_batch
from pipeline.data.decode import max_file_bytes as max_file_bytes
from pipeline.io import Split
from pipeline.params.choices import ConfigError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
IDX_CLASSES_FILE = "classes.txt"  # in an `idx:` directory: one class name a line, line i naming label i
MNIST_FORMAT_CLASSES = 10  # labels an `idx:` source may use without a classes file: 0..9
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass(frozen=True)
class RawDataset:
    train: Split
    test: Split | None
    classes: tuple[str, ...]
    source: str
    skipped: tuple[str, ...] | None = None  # an image folder's entries not read (relative paths); None: no folder


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


def _hidden(path: Path) -> bool:
    return path.name.startswith(".")


def _skipped_name(path: Path, root: Path) -> str:
    """How a skipped entry is named: its path under the image folder, a folder with a trailing slash."""
    return path.relative_to(root).as_posix() + ("/" if path.is_dir() else "")


def _class_files(class_dir: Path, root: Path) -> tuple[list[Path], list[str]]:
    """The image files of one class folder, sorted, and what it holds besides (named, not read). A class
    folder holds images only, no sub-folder (hidden ones, such as ``.ipynb_checkpoints``, are skipped):
    nested classes are refused, not merged."""
    entries = sorted(class_dir.iterdir())
    nested = [p for p in entries if p.is_dir() and not _hidden(p)]
    if nested:
        more = f" (and {len(nested) - 1} more)" if len(nested) > 1 else ""
        raise DataError(f"class folder {class_dir} holds a sub-folder {nested[0]}{more}: an image folder has "
                        "one level of class folders with the images directly inside; make each sub-folder a "
                        f"class folder of its own, or move its images up into {class_dir} to keep them one "
                        "class")
    files = [p for p in entries if p.is_file() and is_image_file(p)]
    if not files:
        held = f"; it holds {', '.join(p.name for p in entries[:5])}{' ...' if len(entries) > 5 else ''}" \
            if entries else ""
        raise DataError(f"class folder {class_dir} holds no images (PNG, JPEG, WebP, BMP, TIFF, GIF or another "
                        f"format Pillow decodes, told by the file's suffix){held}")
    kept = set(files)
    return files, [_skipped_name(p, root) for p in entries if p not in kept]


def _class_dirs(directory: Path) -> tuple[list[Path], list[str], list[str]]:
    """The class folders of an image folder, sorted and checked, their class names, and the entries
    beside them that are not read (files, hidden folders), named."""
    entries = sorted(directory.iterdir())
    class_dirs = [p for p in entries if p.is_dir() and not _hidden(p)]
    if len(class_dirs) < 2:
        raise DataError(f"image folder {directory} needs at least two class sub-folders, found {len(class_dirs)}")
    names = [class_name(p.name, f"image folder {p}") for p in class_dirs]
    twins = sorted({n for n in names if names.count(n) > 1})
    if twins:
        raise DataError(f"image folder {directory}: sub-folders {twins} differ only in their Unicode form "
                        "(NFC/NFD); rename one so each class is one folder")
    return class_dirs, names, [_skipped_name(p, directory) for p in entries if p not in class_dirs]


def load_imagefolder(directory: str | os.PathLike[str], channels: int, image_size: int, *,
                     max_pixels: int = DEFAULT_MAX_PIXELS) -> RawDataset:
    """One sub-folder per class, the images directly inside (a nested sub-folder is refused, named).
    Every file with a suffix Pillow registers for a format it decodes (``IMAGE_SUFFIXES``: PNG, JPEG,
    WebP, BMP, TIFF, GIF, ...) is decoded, converted and resized; the first that cannot be (corrupt,
    truncated, empty, over ``max_pixels``) stops the load, named. Every other entry (a text file,
    ``.DS_Store``, a hidden folder, a file beside the class folders) is skipped and named in
    ``RawDataset.skipped``. The layout is checked in full before any image is decoded."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"image folder {directory} does not exist")
    class_dirs, names, skipped = _class_dirs(directory)
    listed = [_class_files(class_dir, directory) for class_dir in class_dirs]
    images, labels, ids = [], [], []
    for label, (files, beside) in enumerate(listed):
        skipped += beside
        for file in files:
            images.append(decode_image_file(file, channels, image_size, max_pixels=max_pixels))
            labels.append(label)
            ids.append(file.relative_to(directory).as_posix())
    train = Split("train", np.stack(images), np.array(labels, dtype=np.int64), np.array(ids))
    return RawDataset(train, None, tuple(names), f"imagefolder:{directory}", tuple(sorted(skipped)))


def skipped_note(skipped: tuple[str, ...] | None, listed_in: str | os.PathLike[str], shown: int = 10) -> str:
    """``; skipped N (not images): a, b, ...`` for ingest's line, the first ``shown`` named and the
    rest counted (all of them are in ``listed_in``); empty when nothing was skipped."""
    if not skipped:
        return ""
    more = f" and {len(skipped) - shown} more (all in {listed_in} 'skipped')" if len(skipped) > shown else ""
    return f"; skipped {len(skipped)} (not images): {', '.join(skipped[:shown])}{more}"


def check_source(source: str) -> None:
    """``data.source``: a folder source must exist before a 40-minute run is started on it."""
    kind, _, where = source.partition(":")
    if kind in ("imagefolder", "idx", "fashion-mnist") and where and not Path(where).is_dir():
        raise ConfigError(f"data source {source}: folder {where} does not exist")


def load_source(source: str, *, channels: int, image_size: int, max_pixels: int = DEFAULT_MAX_PIXELS
                ) -> RawDataset:
    """Dispatch on the ``data.source`` param: ``fashion-mnist``, ``idx:<dir>``, ``imagefolder:<dir>`` or
    ``digits``.
    ``max_pixels`` (``data.max_pixels``) bounds each image of an image folder (width x height)."""
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
