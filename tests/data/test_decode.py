"""The one decoder: files on disk in any format Pillow decodes by itself, request bytes PNG/JPEG only,
and the size limit read from the header of every format before its pixels are decoded."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.data.decode import (
    FILE_FORMATS,
    IMAGE_SUFFIXES,
    SERVED_FORMATS,
    DataError,
    decode_image_bytes,
    decode_image_file,
    image_header,
    is_image_file,
)


def encoded(fmt: str, size: tuple[int, int] = (12, 5), mode: str = "RGB", **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, (200, 30, 30) if mode == "RGB" else 77).save(buffer, format=fmt, **options)
    return buffer.getvalue()


def test_file_formats_hold_the_common_ones_and_none_that_needs_an_outside_program():
    assert {"PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF"} <= set(FILE_FORMATS)
    assert not {"EPS", "MPEG", "HDF5", "GRIB", "BUFR", "WMF", "PDF"} & set(FILE_FORMATS)
    assert {".webp", ".bmp", ".tif", ".tiff", ".gif", ".png", ".jpg", ".jpeg"} <= set(IMAGE_SUFFIXES)
    assert is_image_file(Path("x/Photo.WEBP"))
    assert not any(is_image_file(Path(n)) for n in ("a.txt", ".DS_Store", "b.eps", "c.pdf", "d.h5"))


@pytest.mark.parametrize("fmt", ["WEBP", "BMP", "TIFF", "GIF"])
def test_header_of_other_formats_is_read_for_files_only(fmt):
    data = encoded(fmt, (12, 5))
    assert image_header(data, FILE_FORMATS) == (fmt, 12, 5)
    with pytest.raises(ValueError, match="not a PNG or JPEG"):
        image_header(data)  # a request's bytes: PNG/JPEG only
    with pytest.raises(DataError, match="row 2 cannot be decoded: not a PNG or JPEG"):
        decode_image_bytes(data, 3, 4, name="row 2")


@pytest.mark.parametrize("fmt", ["WEBP", "BMP", "TIFF"])
def test_other_formats_decode_to_the_pixels_they_hold(tmp_path, fmt):
    path = tmp_path / f"red.{fmt.lower()}"
    path.write_bytes(encoded(fmt, (12, 5), lossless=True) if fmt == "WEBP" else encoded(fmt, (12, 5)))
    rgb = decode_image_file(path, 3, (5, 12))  # native size: no resize
    assert rgb.shape == (3, 5, 12)
    assert (rgb[0] == 200).all() and (rgb[1] == 30).all() and (rgb[2] == 30).all()


def test_other_formats_are_held_to_the_pixel_limit_before_decoding(tmp_path):
    path = tmp_path / "big.bmp"
    path.write_bytes(encoded("BMP", (64, 64), mode="L"))
    assert decode_image_file(path, 1, 8, max_pixels=64 * 64).shape == (1, 8, 8)
    with pytest.raises(DataError, match=f"image file {path} is too large: 64 x 64"):
        decode_image_file(path, 1, 8, max_pixels=64 * 64 - 1)


def test_a_file_no_opener_accepts_is_named(tmp_path):
    path = tmp_path / "notes.gif"
    path.write_text("not an image")
    with pytest.raises(DataError, match=f"image file {path} cannot be decoded: not a PNG or JPEG, nor another"):
        decode_image_file(path, 1, 8)


def test_served_formats_stay_png_and_jpeg():
    assert SERVED_FORMATS == ("PNG", "JPEG")
    grey = decode_image_bytes(encoded("PNG", (6, 6), mode="L"), 1, 6)
    assert grey.shape == (1, 6, 6) and (grey == 77).all()
    assert np.array_equal(decode_image_bytes(encoded("PNG", (6, 6), mode="L"), 1, 6, formats=FILE_FORMATS), grey)


SHAPES = [((1, 1, 8, 8), 16), ((5, 3, 48, 31), 16), ((2, 1, 28, 28), (28, 14)), ((1, 3, 64, 64), 32),
          ((3, 1, 17, 9), (40, 23)), ((0, 1, 8, 8), 4)]


@pytest.mark.parametrize("native", [True, False])
def test_resizing_is_torchvisions_to_the_bit_without_importing_it(monkeypatch, native: bool) -> None:
    """resize_batch gives torchvision's resize (bilinear, antialiased) exactly, up and down, grey and
    colour, on the CPU's native uint8 path and on the float path other CPUs take; and it does not import
    torchvision (whose import pulls in torch._dynamo: seconds of every ingest)."""
    import subprocess
    import sys
    import warnings

    import torch

    from pipeline.data.decode import resize_batch

    if not native:  # both sides then take the float32-and-round path of CPUs without AVX2
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchvision.transforms.v2 import functional as F
    rng = np.random.default_rng(0)
    for shape, size in SHAPES:
        images = rng.integers(0, 256, shape, dtype=np.uint8)
        hw = [size, size] if isinstance(size, int) else list(size)
        want = F.resize(torch.from_numpy(images), hw, antialias=True).numpy()
        got = resize_batch(images, size)
        assert got.dtype == np.uint8 and got.shape == want.shape and np.array_equal(got, want), (shape, size)
    probe = ("import sys, numpy as np\nfrom pipeline.data.decode import resize_batch\n"
             "resize_batch(np.zeros((2, 1, 8, 8), dtype=np.uint8), 16)\nprint('torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
