"""Image bytes to uint8 pixels: one decoder for every image the project reads.

Ingest's image folders, ``cascade recognize`` and the served model's ``image`` column all go through
:func:`decode_image_bytes`: the size is read from the header and checked against ``max_pixels`` before
any pixel is decoded, any bit depth and mode is converted to uint8 grey or RGB, then resized.

Which formats: files on disk (image folders, ``cascade recognize``) may be in any format Pillow
decodes by itself (:data:`FILE_FORMATS`, read from Pillow's registered openers, so WebP, BMP, TIFF,
GIF and the rest come with the installed Pillow); bytes from a request stay PNG/JPEG
(:data:`SERVED_FORMATS`): a server should not run some thirty decoders on a stranger's bytes, and
PNG/JPEG headers are parsed here without Pillow. docs/DESIGN.md "Your own data" ("Every file of an image
folder accounted for") says which files an image folder reads and which it skips."""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np


class DataError(ValueError):
    """Bad input data; the message names the offending file or item."""


def _native_uint8_bilinear() -> bool:
    """Whether torch resizes uint8 images bilinearly by itself on this CPU (AVX2/AVX-512, ARM), as
    torchvision decides it; elsewhere they are resized in float32 and rounded."""
    import platform

    import torch

    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")


def resize_batch(images: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    """Resize uint8 ``(N, C, H, W)`` images to ``size`` x ``size`` or ``(h, w)`` (bilinear, antialiased):
    torchvision's ``transforms.v2.functional.resize`` to the bit (tests/data/test_decode.py compares
    them), with torch alone, since importing torchvision pulls in ``torch._dynamo``, 1.8 s of every
    ingest process (docs/RESULTS.md "Where the quick command's time goes")."""
    hw = (int(size), int(size)) if np.ndim(size) == 0 else (int(size[0]), int(size[1]))
    if tuple(images.shape[-2:]) == hw:
        return images
    if images.shape[0] == 0:
        return np.empty((0, images.shape[1], *hw), dtype=images.dtype)
    import torch
    from torch.nn.functional import interpolate

    batch = torch.from_numpy(np.ascontiguousarray(images))  # (N, C, H, W)
    if _native_uint8_bilinear():
        return interpolate(batch, size=list(hw), mode="bilinear", align_corners=False, antialias=True).numpy()
    out = interpolate(batch.to(torch.float32), size=list(hw), mode="bilinear", align_corners=False, antialias=True)
    return out.round_().to(torch.uint8).numpy()  # (N, C, h, w)


# Pillow formats it opens but does not decode by itself: EPS runs the Ghostscript program on the
# file's PostScript, MPEG is identified only; stub formats (HDF5, GRIB, BUFR, WMF) need a handler
# installed from outside Pillow. Files of these are skipped (named), not read.
_OUTSIDE_PILLOW = frozenset({"EPS", "MPEG"})
SERVED_FORMATS = ("PNG", "JPEG")


def _file_suffixes() -> dict[str, str]:
    """Suffix (lower case, with the dot) -> Pillow format, for every format Pillow decodes itself."""
    from PIL import Image, ImageFile

    Image.init()
    found = {}
    for suffix, fmt in Image.registered_extensions().items():
        opener = Image.OPEN.get(fmt, (None,))[0]
        if opener is None or fmt in _OUTSIDE_PILLOW:
            continue  # save-only (PDF, PALM, MPO's writer) or not decoded by Pillow itself
        if isinstance(opener, type) and issubclass(opener, ImageFile.StubImageFile):
            continue
        found[suffix.lower()] = fmt
    return found


_SUFFIX_FORMATS = _file_suffixes()
IMAGE_SUFFIXES = tuple(sorted(_SUFFIX_FORMATS))  # an image folder's images; other files are skipped, named
FILE_FORMATS = tuple(sorted(set(_SUFFIX_FORMATS.values())))


def is_image_file(path: Path) -> bool:
    """A file an image folder reads (by its suffix: decoded, or refused by name if it cannot be)."""
    return path.suffix.lower() in _SUFFIX_FORMATS


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


def image_header(data: bytes, formats: tuple[str, ...] = SERVED_FORMATS) -> tuple[str, int, int]:
    """``(format, width, height)`` of image bytes without decoding any pixel: PNG/JPEG from the PNG
    IHDR chunk or the first JPEG frame header (SOFn), any other of ``formats`` from the header Pillow
    reads when it opens a file (it decodes pixels only on ``load``); ValueError says what is wrong."""
    if data.startswith(PNG_SIGNATURE) or data.startswith(JPEG_SIGNATURE):
        return _png_jpeg_header(data)
    others = [fmt for fmt in formats if fmt not in SERVED_FORMATS]
    if not others:
        raise ValueError(f"not a PNG or JPEG (it starts with {data[:8]!r})")
    return _pillow_header(data, others)


def _pillow_header(data: bytes, formats: list[str]) -> tuple[str, int, int]:
    from PIL import Image

    try:
        with warnings.catch_warnings():  # Pillow's size warning: our own limit is checked on the size read
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data), formats=formats) as image:
                return str(image.format), image.size[0], image.size[1]
    except Image.DecompressionBombError as exc:
        raise ValueError(f"Pillow refuses its size: {exc}") from None
    except Exception:  # no opener of these formats accepts its header
        raise ValueError(f"not a PNG or JPEG, nor another image format Pillow reads (it starts with "
                         f"{data[:8]!r})") from None


def _png_jpeg_header(data: bytes) -> tuple[str, int, int]:
    if data.startswith(PNG_SIGNATURE):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise ValueError("truncated PNG header (no IHDR chunk)")
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        return "PNG", width, height
    i, n = 2, len(data)  # JPEG: walk the segments to the first frame header
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


def _opened(data: bytes, fmt: str) -> Any:
    """A lazily opened Pillow image of a format whose header was read and checked."""
    from PIL import Image, JpegImagePlugin, PngImagePlugin

    if fmt in SERVED_FORMATS:  # constructed directly: the header parsed here said PNG or JPEG
        opener = PngImagePlugin.PngImageFile if fmt == "PNG" else JpegImagePlugin.JpegImageFile
        return opener(io.BytesIO(data))
    return Image.open(io.BytesIO(data), formats=[fmt])


def decode_image_bytes(data: bytes, channels: int, size: int | tuple[int, int], *,
                       max_pixels: int = DEFAULT_MAX_PIXELS, name: str = "image",
                       formats: tuple[str, ...] = SERVED_FORMATS) -> np.ndarray:
    """Image bytes (PNG/JPEG, or any of ``formats``) of any size, bit depth or mode -> uint8
    ``(channels, size, size)`` (or ``(channels, h, w)``); an animated or multi-page image gives its
    first frame. An image over ``max_pixels`` (width x height, from the header) is refused before its
    pixels are decoded. Every failure is a :class:`DataError` whose message starts with ``name``."""
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if not data:
        raise DataError(f"{name} is empty")
    try:
        fmt, width, height = image_header(data, formats)
    except ValueError as exc:
        raise DataError(f"{name} cannot be decoded: {exc}") from None
    if width < 1 or height < 1:
        raise DataError(f"{name} cannot be decoded: its header says {width} x {height} pixels")
    if width * height > max_pixels:
        raise DataError(f"{name} is too large: {width} x {height} = {width * height:,} pixels, over the "
                        f"limit of {max_pixels:,} pixels")
    try:
        with warnings.catch_warnings():  # Pillow's palette/transparency notes; our own size limit is checked
            warnings.simplefilter("ignore")
            with _opened(data, fmt) as image:
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
    """Decode one image file (any format of :data:`FILE_FORMATS`: PNG, JPEG, WebP, BMP, TIFF, GIF, ...)
    of any size, bit depth or mode to uint8 ``(channels, size, size)``; a :class:`DataError` naming the
    file if it is missing, empty, not an image Pillow reads, corrupt or too large."""
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
    return decode_image_bytes(data, channels, size, max_pixels=max_pixels, name=name, formats=FILE_FORMATS)
