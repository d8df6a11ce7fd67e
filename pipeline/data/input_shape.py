"""The model's input shape from the data: ``data.image_size: auto`` and ``data.channels: auto``.

An image folder is sampled (up to ``SAMPLE`` files spread evenly over its sorted list, so the choice is
deterministic) and each sampled file decoded at its own size in RGB:

- size: the median shorter side of the sample, kept between ``AUTO_MIN_SIZE`` and ``AUTO_MAX_SIZE``
  (the cap keeps a quick run on a 2-core CPU in minutes; a params value overrides it);
- colour: 3 channels when more than ``COLOUR_IMAGE_SHARE`` of the sampled images carry colour (more than
  ``COLOUR_PIXEL_SHARE`` of their pixels with channels ``COLOUR_SPREAD`` apart: JPEG noise on a grey
  picture stays below that), else 1.

IDX sources (Fashion-MNIST) are grey at their own size; scikit-learn's digits are 8 px grey, raised to
``AUTO_MIN_SIZE``. A value given in params is kept as given, and the choice says so when it drops
colour or shrinks the images, so nothing is reduced without a word."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.data.decode import FILE_FORMATS, is_image_file
from pipeline.data.sources import (
    DEFAULT_MAX_PIXELS,
    DataError,
    _find_idx,
    decode_image_bytes,
    image_header,
)

AUTO_MAX_SIZE = 64
AUTO_MIN_SIZE = 16
SAMPLE = 256
COLOUR_SPREAD = 24  # max - min over R, G, B of one pixel, in 0..255
COLOUR_PIXEL_SHARE = 0.02
COLOUR_IMAGE_SHARE = 0.1
FASHION_DIR = "/usr/share/datasets/fashion-mnist"


@dataclass(frozen=True)
class InputChoice:
    """What ingest converts every image to, and why, in one line (``reason``)."""

    image_size: int
    channels: int
    reason: str
    native_size: int | None = None  # the data's median shorter side
    colour_share: float | None = None  # share of sampled images that carry colour

    def to_json(self) -> dict:
        return {
            "shape": [self.channels, self.image_size, self.image_size],
            "reason": self.reason,
            "native_size": self.native_size,
            "colour_share": self.colour_share,
        }


def carries_colour(rgb: np.ndarray) -> bool:
    """An RGB uint8 ``(3, H, W)`` image is in colour when enough of its pixels have distinct channels."""
    spread = rgb.max(axis=0).astype(np.int16) - rgb.min(axis=0).astype(np.int16)  # (H, W)
    return bool((spread > COLOUR_SPREAD).mean() > COLOUR_PIXEL_SHARE)


def sample_files(directory: Path, sample: int = SAMPLE) -> list[Path]:
    """Up to ``sample`` images of an image folder, spread evenly over its sorted list of files."""
    files = sorted(
        p
        for d in sorted(directory.iterdir())
        if d.is_dir() and not d.name.startswith(".")
        for p in d.iterdir()
        if p.is_file() and is_image_file(p)
    )
    if not files:
        raise DataError(f"image folder {directory} holds no images in its class folders")
    picks = np.unique(np.linspace(0, len(files) - 1, min(sample, len(files))).round().astype(int))
    return [files[i] for i in picks]


def probe_folder(directory: Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, float]:
    """(median shorter side, share of images in colour) of a sample of the folder's images."""
    sides, coloured = [], 0
    for path in sample_files(directory):
        data = path.read_bytes()
        try:
            _, width, height = image_header(data, FILE_FORMATS)
        except ValueError as exc:
            raise DataError(f"image file {path} cannot be decoded: {exc}") from None
        sides.append(min(width, height))
        rgb = decode_image_bytes(data, 3, (height, width), max_pixels=max_pixels, name=f"image file {path}",
                                 formats=FILE_FORMATS)
        coloured += carries_colour(rgb)
    return int(statistics.median(sides)), coloured / len(sides)


def native_input(source: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, float, str]:
    """(size, colour share, what was read) of a source's images as they are."""
    kind, _, where = source.partition(":")
    if kind == "imagefolder":
        directory = Path(where)
        if not directory.is_dir():
            raise DataError(f"image folder {directory} does not exist")
        size, share = probe_folder(directory, max_pixels)
        return size, share, f"{len(sample_files(directory))} sampled images"
    if kind in ("fashion-mnist", "idx"):
        directory = Path(where or FASHION_DIR)
        header = _find_idx(directory, "train-images-idx3-ubyte")
        import gzip

        opener = gzip.open if header.suffix == ".gz" else open
        with opener(header, "rb") as fh:
            head = fh.read(16)
        if len(head) < 16:
            raise DataError(f"IDX file {header} has a truncated header")
        height, width = int.from_bytes(head[8:12], "big"), int.from_bytes(head[12:16], "big")
        return min(height, width), 0.0, "IDX images"
    if kind == "digits":
        return 8, 0.0, "scikit-learn digits"
    raise DataError(
        f"unknown data source {source!r}; use fashion-mnist, idx:<dir>, imagefolder:<dir> or digits"
    )


def choose_input(
    image_size: int | str, channels: int | str, native: int, colour_share: float, what: str
) -> InputChoice:
    """The input shape from params (an int wins) and the data (``auto``), with the reason in words."""
    words = []
    if image_size == "auto":
        size = min(max(native, AUTO_MIN_SIZE), AUTO_MAX_SIZE)
        note = (
            ""
            if size == native
            else (
                f", capped at {AUTO_MAX_SIZE} (data.image_size sets another)"
                if size < native
                else f", raised to the floor of {AUTO_MIN_SIZE}"
            )
        )
        words.append(f"size {size} (auto: median shorter side {native} px over the {what}{note})")
    else:
        size = int(image_size)
        note = f"; the images' median side is {native} px: shrunk" if native > size else ""
        words.append(f"size {size} (data.image_size{note})")
    colour = colour_share > COLOUR_IMAGE_SHARE
    if channels == "auto":
        chans = 3 if colour else 1
        words.append(
            f"{'colour' if colour else 'grey'} (auto: {100 * colour_share:.0f}% of the {what} carry colour)"
        )
    else:
        chans = int(channels)
        note = (
            f"; {100 * colour_share:.0f}% of the images carry colour: colour dropped"
            if chans == 1 and colour
            else ""
        )
        words.append(f"{'colour' if chans == 3 else 'grey'} (data.channels{note})")
    return InputChoice(size, chans, f"input {chans}x{size}x{size}: " + ", ".join(words), native, colour_share)


def resolve_input(
    source: str, image_size: int | str, channels: int | str, max_pixels: int = DEFAULT_MAX_PIXELS
) -> InputChoice:
    """The input shape ingest converts ``source``'s images to (:func:`choose_input` on what it holds)."""
    native, share, what = native_input(source, max_pixels)
    choice = choose_input(image_size, channels, native, share, what)
    if source.partition(":")[0] != "imagefolder" and choice.channels != 1:  # IDX and digits are grey
        return InputChoice(
            choice.image_size,
            1,
            choice.reason.replace("input 3x", "input 1x").replace(
                "colour (data.channels)", "grey (IDX and digits sources are grey whatever data.channels says)"
            ),
            native,
            share,
        )
    return choice
