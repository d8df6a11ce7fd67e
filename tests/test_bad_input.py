"""Bad input everywhere images enter (README "Recovery": a failed stage names the file): ingest's image
folders, `cascade recognize` and the
served model's payload. One decoder (:func:`pipeline.data.sources.decode_image_bytes`) converts any bit
depth and mode, refuses an image whose header says it is over the pixel limit before decoding it,
and every error names the file or the row. Images are generated here with numpy and Pillow."""

from __future__ import annotations

import base64
import importlib
import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from pipeline.cli import DEFAULT_MAX_PIXELS as CLI_DEFAULT_MAX_PIXELS
from pipeline.cli import main as cli_main
from pipeline.data.sources import (
    DEFAULT_MAX_PIXELS,
    DataError,
    decode_image_bytes,
    decode_image_file,
    image_header,
    load_imagefolder,
    load_source,
    max_file_bytes,
)
from pipeline.registry.register import decode_payload
from tests.routing.test_package import save_tiny

# ------------------------------------------------------------------------------------------ builders


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png_bytes(width: int, height: int, bit_depth: int = 8, colour_type: int = 0, rows: bytes | None = None
              ) -> bytes:
    """A PNG with this IHDR; ``rows`` (filter byte + samples per row) default to a few zero rows only,
    so the header can claim far more pixels than the file holds (a decompression bomb's shape)."""
    rows = b"\0" * 64 if rows is None else rows
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(rows))
            + _chunk(b"IEND", b""))


def bomb_png(width: int = 20000, height: int = 20000) -> bytes:
    """A real, decodable 8-bit grey PNG of ``width`` x ``height`` zeros: tiny on disk, GBs decoded."""
    comp = zlib.compressobj(9)
    row = b"\0" * (width + 1)
    body = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")


def pil_bytes(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


def noise(shape: tuple[int, ...], seed: int = 0, high: int = 256, dtype: type = np.uint8) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, high, shape).astype(dtype)


def jpeg_with_size(width: int, height: int) -> bytes:
    """A real 8x8 JPEG whose frame header (SOF0) is rewritten to claim ``width`` x ``height``."""
    data = bytearray(pil_bytes(Image.fromarray(noise((8, 8))), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module fixtures run before the autouse one
    try:
        return save_tiny(tmp_path_factory.mktemp("bad_input") / "model")[1]  # takes (1, 16, 16)
    finally:
        torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------- decoding


def test_png_and_jpeg_headers_are_read_without_decoding() -> None:
    assert image_header(png_bytes(20000, 30000)) == ("PNG", 20000, 30000)
    assert image_header(jpeg_with_size(5000, 7000)) == ("JPEG", 5000, 7000)
    exif = pil_bytes(Image.new("RGB", (33, 17), (9, 9, 9)), "JPEG")
    assert image_header(exif) == ("JPEG", 33, 17)  # APP0 (JFIF) and quant tables before SOF
    for bad, reason in ((b"\x89PNG\r\n\x1a\n\0\0", "truncated PNG header"),
                        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "truncated JPEG header"),
                        (b"GIF89a....", "not a PNG or JPEG")):
        with pytest.raises(ValueError, match=reason):
            image_header(bad)


def test_corrupt_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.png"
    path.write_bytes(png_bytes(16, 16)[:33] + b"this is not zlib data at all" * 4)
    with pytest.raises(DataError, match=f"image file {path} cannot be decoded"):
        decode_image_file(path, 1, 16)


def test_truncated_png_is_named(tmp_path: Path) -> None:
    good = pil_bytes(Image.fromarray(noise((32, 32))), "PNG")
    path = tmp_path / "cut.png"
    path.write_bytes(good[:len(good) // 2])
    with pytest.raises(DataError, match=f"image file {path} cannot be decoded"):
        decode_image_file(path, 1, 16)


def test_truncated_jpeg_is_named(tmp_path: Path) -> None:
    good = pil_bytes(Image.fromarray(noise((64, 64, 3))), "JPEG")
    path = tmp_path / "cut.jpg"
    path.write_bytes(good[:len(good) // 2])
    with pytest.raises(DataError, match=f"image file {path} cannot be decoded"):
        decode_image_file(path, 1, 16)


def test_empty_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "empty.png"
    path.write_bytes(b"")
    with pytest.raises(DataError, match=f"image file {path} is empty"):
        decode_image_file(path, 1, 16)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"image file {tmp_path / 'gone.png'} cannot be read"):
        decode_image_file(tmp_path / "gone.png", 1, 16)


def test_wrong_extension(tmp_path: Path) -> None:
    """The content decides, not the name: a PNG named .jpg decodes; text named .png is refused."""
    array = noise((16, 16), seed=3)
    (tmp_path / "a.png").write_bytes(pil_bytes(Image.fromarray(array), "PNG"))
    (tmp_path / "a.jpg").write_bytes((tmp_path / "a.png").read_bytes())
    np.testing.assert_array_equal(decode_image_file(tmp_path / "a.jpg", 1, 16)[0], array)
    text = tmp_path / "notes.png"
    text.write_text("hello, not an image")
    with pytest.raises(DataError, match=f"image file {text} cannot be decoded: not a PNG or JPEG"):
        decode_image_file(text, 1, 16)


def test_16bit_grey_png_is_scaled_to_8_bits(tmp_path: Path) -> None:
    wide = noise((12, 20), seed=1, high=65536, dtype=np.uint16)
    wide[0, :4] = [0, 257 * 100, 65535, 128]  # exact multiples of 257 map to k; 128 rounds down
    path = tmp_path / "g16.png"
    Image.fromarray(wide).save(path)
    assert path.read_bytes()[24] == 16  # really a 16-bit PNG (IHDR bit depth)
    got = decode_image_file(path, 1, (12, 20))  # native size: no resize
    assert got.dtype == np.uint8 and got.shape == (1, 12, 20)
    np.testing.assert_array_equal(got[0], (wide.astype(np.int64) + 128) // 257)
    assert list(got[0, 0, :4]) == [0, 100, 255, 0]
    rgb = decode_image_file(path, 3, 8)
    assert rgb.shape == (3, 8, 8) and (rgb[0] == rgb[1]).all() and (rgb[1] == rgb[2]).all()


def test_16bit_rgb_png_is_converted(tmp_path: Path) -> None:
    samples = np.full((4, 6, 3), 0x80FF, dtype=">u2")
    samples[..., 1] = 0xFF00
    rows = b"".join(b"\0" + samples[r].tobytes() for r in range(4))
    data = png_bytes(6, 4, bit_depth=16, colour_type=2, rows=rows)
    got = decode_image_bytes(data, 3, (4, 6))
    assert got.dtype == np.uint8 and list(got[:, 0, 0]) == [0x80, 0xFF, 0x80]


ORANGE = Image.new("RGB", (10, 10), (200, 100, 50))
MODES = {  # name -> (image, format, expected grey value of the uniform image, tolerance)
    "palette": (ORANGE.convert("P", palette=Image.Palette.ADAPTIVE), "PNG", 124, 1),
    "grey+alpha": (Image.new("LA", (10, 10), (90, 40)), "PNG", 90, 0),
    "rgba": (Image.new("RGBA", (10, 10), (0, 255, 0, 10)), "PNG", 150, 1),
    "bilevel": (Image.new("1", (10, 10), 1), "PNG", 255, 0),
    "cmyk jpeg": (Image.new("CMYK", (16, 16), (0, 0, 0, 0)), "JPEG", 255, 3),
    "ycbcr-free grey jpeg": (Image.new("L", (16, 16), 77), "JPEG", 77, 2),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_any_mode_is_converted(mode: str) -> None:
    image, fmt, grey, tol = MODES[mode]
    data = pil_bytes(image, fmt)
    got = decode_image_bytes(data, 1, 8)
    assert got.dtype == np.uint8 and got.shape == (1, 8, 8)
    assert np.abs(got.astype(int) - grey).max() <= tol, (mode, got[0, 0, 0])
    assert decode_image_bytes(data, 3, 8).shape == (3, 8, 8)


def test_oversized_png_header_is_refused_before_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    path = tmp_path / "bomb.png"
    path.write_bytes(bomb_png())  # ~390 KB on disk, 400 M pixels (a decode would need GBs)
    assert path.stat().st_size < 500_000

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("the pixels were decoded")

    from PIL import PngImagePlugin

    monkeypatch.setattr(PngImagePlugin.PngImageFile, "__init__", no_decoding)
    message = rf"image file {path} is too large: 20000 x 20000 = 400,000,000 pixels, over the limit of 16,7"
    with pytest.raises(DataError, match=message):
        decode_image_file(path, 1, 16)


def test_oversized_jpeg_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.jpg"
    path.write_bytes(jpeg_with_size(30000, 20000))
    with pytest.raises(DataError, match=f"image file {path} is too large: 30000 x 20000"):
        decode_image_file(path, 1, 16)


def test_pixel_limit_is_a_parameter(tmp_path: Path) -> None:
    path = tmp_path / "square.png"
    Image.fromarray(noise((64, 64))).save(path)
    assert decode_image_file(path, 1, 16, max_pixels=64 * 64).shape == (1, 16, 16)
    with pytest.raises(DataError, match="64 x 64 = 4,096 pixels, over the limit of 4,095"):
        decode_image_file(path, 1, 16, max_pixels=64 * 64 - 1)
    assert DEFAULT_MAX_PIXELS == CLI_DEFAULT_MAX_PIXELS == 4096 * 4096


def test_file_larger_than_any_allowed_image_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "padded.png"
    path.write_bytes(png_bytes(4, 4) + b"\0" * (max_file_bytes(16) + 1))
    with pytest.raises(DataError, match=f"image file {path} is too large: .* bytes"):
        decode_image_file(path, 1, 4, max_pixels=16)


def test_header_and_decoder_disagree() -> None:
    data = bytearray(png_bytes(16, 16))
    with pytest.raises(DataError, match="cannot be decoded"):  # a zero height in the header
        decode_image_bytes(bytes(data[:20]) + b"\0\0\0\0" + bytes(data[24:]), 1, 8)


# --------------------------------------------------------------------------------------------- ingest


def image_folder(root: Path) -> Path:
    for name, value in (("cat", 40), ("dog", 200)):
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((20, 20), value + i, np.uint8)).save(root / name / f"{i}.png")
    return root


def test_imagefolder_16bit_file_is_accepted(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "imgs")
    Image.fromarray(np.full((20, 20), 257 * 123, np.uint16)).save(root / "dog" / "g16.png")
    data = load_imagefolder(root, channels=1, image_size=8)
    assert data.train.images.dtype == np.uint8
    got = data.train.images[list(data.train.ids).index("dog/g16.png")]
    assert (got == 123).all()


@pytest.mark.parametrize("bad", ["corrupt", "oversized", "empty"])
def test_imagefolder_bad_file_is_named(tmp_path: Path, bad: str) -> None:
    root = image_folder(tmp_path / "imgs")
    path = root / "dog" / "1b.png"
    path.write_bytes({"corrupt": b"\x89PNG\r\n\x1a\n" + b"garbage" * 10, "oversized": png_bytes(5000, 5000),
                      "empty": b""}[bad])
    with pytest.raises(DataError, match=str(path)):
        load_source(f"imagefolder:{root}", channels=1, image_size=8)


def test_imagefolder_limit_is_passed_through(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "imgs")
    with pytest.raises(DataError, match="cat/0.png is too large: 20 x 20"):
        load_source(f"imagefolder:{root}", channels=1, image_size=8, max_pixels=399)
    assert len(load_source(f"imagefolder:{root}", channels=1, image_size=8, max_pixels=400).train) == 6


def test_ingest_stage_names_the_bad_file_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    from pipeline.params.config import load_params
    from stages import ingest

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    root = image_folder(tmp_path / "imgs")
    bad = root / "cat" / "2b.png"
    bad.write_bytes(pil_bytes(Image.fromarray(noise((32, 32))), "PNG")[:100])  # truncated
    params = load_params("params.yaml")
    params["data"].update(source=f"imagefolder:{root}", image_size=8)
    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump(params))
    out, metrics = tmp_path / "prepared", tmp_path / "m.json"
    assert ingest.main(["--params", str(params_path), "--out", str(out), "--metrics", str(metrics)]) == 4
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: image file {bad} cannot be decoded")
    assert not out.exists() and not metrics.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".prepared")] == []


def test_ingest_stage_passes_the_pixel_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``data.max_pixels`` reaches the source loader: 20 x 20 images pass at 400 pixels, not at 399."""
    import yaml

    from pipeline.params.config import load_params
    from stages import ingest

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    root = image_folder(tmp_path / "imgs")
    for class_dir in ("cat", "dog"):  # 20 images a class: enough for every split (19 needed at the defaults)
        for i in range(3, 20):
            Image.fromarray(np.full((20, 20), 60 + i, np.uint8)).save(root / class_dir / f"{i}.png")
    params = load_params("params.yaml")
    for limit, status in ((399, 4), (400, 0)):  # 4: a data error (pipeline.exit_codes)
        params["data"].update(source=f"imagefolder:{root}", image_size=8, max_pixels=limit)
        params_path = tmp_path / f"params{limit}.yaml"
        params_path.write_text(yaml.safe_dump(params))
        out, metrics = tmp_path / f"prepared{limit}", tmp_path / f"m{limit}.json"
        argv = ["--params", str(params_path), "--out", str(out), "--metrics", str(metrics)]
        assert ingest.main(argv) == status, capsys.readouterr().err
        err = capsys.readouterr().err
        if status:
            assert f"error: image file {root / 'cat' / '0.png'} is too large: 20 x 20 = 400 pixels" in err
            assert "over the limit of 399 pixels" in err and not out.exists()
        else:
            assert out.is_dir() and metrics.exists()


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_answers_the_good_files_and_names_the_bad_ones(model_dir: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    good, g16, bomb, corrupt = (tmp_path / n for n in ("good.png", "g16.png", "bomb.png", "corrupt.jpg"))
    Image.fromarray(noise((16, 16))).save(good)
    Image.fromarray(noise((30, 30), high=65536, dtype=np.uint16)).save(g16)
    bomb.write_bytes(bomb_png())
    corrupt.write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    status = cli_main(["recognize", str(good), str(bomb), str(g16), str(corrupt), "--model", str(model_dir)])
    out, err = capsys.readouterr()
    assert status == 1
    answered = [line.split()[0] for line in out.strip().splitlines()[1:]]
    assert answered == [str(good), str(g16)]
    errors = err.strip().splitlines()
    assert len(errors) == 2
    assert errors[0].startswith(f"error: {bomb}: ") and "too large: 20000 x 20000" in errors[0]
    assert errors[1].startswith(f"error: {corrupt}: ") and "cannot be decoded" in errors[1]
    assert "Traceback" not in err


def test_cli_max_pixels_option(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "a.png"
    Image.fromarray(noise((16, 16))).save(path)
    assert cli_main(["recognize", str(path), "--model", str(model_dir), "--max-pixels", "256"]) == 0
    capsys.readouterr()
    assert cli_main(["recognize", str(path), "--model", str(model_dir), "--max-pixels", "255"]) == 1
    assert "16 x 16 = 256 pixels, over the limit of 255" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["recognize", str(path), "--max-pixels", "0"])
    capsys.readouterr()


# -------------------------------------------------------------------------------------------- serving


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


GOOD_PNG = pil_bytes(Image.fromarray(noise((16, 16))), "PNG")


def frame_of(*values: object, column: str = "image") -> pd.DataFrame:
    return pd.DataFrame({column: pd.Series(list(values), dtype=object)})


@pytest.mark.parametrize(("bad", "message"), [
    (b64(GOOD_PNG[:len(GOOD_PNG) // 2]), "row 1: image cannot be decoded"),
    (b64(b""), "row 1: image is empty"),
])
def test_payload_bad_row_is_named(bad: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_payload(frame_of(b64(GOOD_PNG), bad, b64(GOOD_PNG)), (1, 16, 16))


def test_payload_other_formats_are_refused() -> None:
    with pytest.raises(ValueError, match="row 1: image cannot be decoded: not a PNG or JPEG"):
        decode_payload(frame_of(b64(GOOD_PNG), b64(b"GIF89a not supported")), (1, 16, 16))


def test_payload_16bit_row_is_converted() -> None:
    wide = np.full((16, 16), 257 * 77, np.uint16)
    got = decode_payload(frame_of(b64(GOOD_PNG), b64(pil_bytes(Image.fromarray(wide), "PNG"))), (1, 16, 16))
    assert got.dtype == np.uint8 and (got[1] == 77).all()


def test_payload_decodes_like_the_cli(tmp_path: Path) -> None:
    rgb = pil_bytes(Image.fromarray(noise((20, 24, 3), seed=5)), "PNG")
    (tmp_path / "rgb.png").write_bytes(rgb)
    np.testing.assert_array_equal(decode_payload(frame_of(b64(rgb)), (1, 16, 16))[0],
                                  decode_image_file(tmp_path / "rgb.png", 1, 16))


def test_payload_oversized_image_row_is_named() -> None:
    with pytest.raises(ValueError, match="row 1: image is too large: 20000 x 20000"):
        decode_payload(frame_of(b64(GOOD_PNG), b64(png_bytes(20000, 20000))), (1, 16, 16))
    with pytest.raises(ValueError, match="row 0: image is too large: 16 x 16"):
        decode_payload(frame_of(b64(GOOD_PNG)), (1, 16, 16), max_pixels=255)


def test_payload_oversized_pixels_row_is_named() -> None:
    frame = frame_of(np.zeros((16, 16), np.uint8), np.zeros((1, 20, 30), np.uint8), column="pixels")
    with pytest.raises(ValueError, match="row 1: pixels are too large: 20 x 30 = 600 pixels"):
        decode_payload(frame, (1, 16, 16), max_pixels=599)


def test_empty_frame_is_refused() -> None:
    for frame in (pd.DataFrame({"image": []}), pd.DataFrame({"pixels": []})):
        with pytest.raises(ValueError, match="no rows"):
            decode_payload(frame, (1, 16, 16))


def test_request_size_is_limited() -> None:
    max_request_bytes = importlib.import_module(decode_payload.__module__).MAX_REQUEST_BYTES
    frame = frame_of(*([b64(GOOD_PNG)] * 3))
    size = 3 * len(b64(GOOD_PNG))
    assert decode_payload(frame, (1, 16, 16), max_bytes=size).shape == (3, 1, 16, 16)
    with pytest.raises(ValueError, match=f"{size:,} bytes of image data, over the limit of {size - 1:,}"):
        decode_payload(frame, (1, 16, 16), max_bytes=size - 1)
    assert 1 << 20 <= max_request_bytes < 21_000_000  # a 21 MB request is refused by default


def test_served_model_answers_a_bad_request_with_400(model_dir: Path) -> None:
    """The pyfunc model turns a refused payload into MLflow's INVALID_PARAMETER_VALUE: HTTP 400."""
    from mlflow.exceptions import MlflowException

    from pipeline.registry import mlflow_models
    from pipeline.routing.package import load_cascade

    model = mlflow_models.CascadeModel()
    model._loaded = load_cascade(model_dir)
    assert len(model.predict(None, frame_of(b64(GOOD_PNG)))) == 1
    huge = frame_of(b64(GOOD_PNG), b64(png_bytes(9000, 9000)))
    for frame, message in ((pd.DataFrame({"image": []}), "no rows"), (huge, "row 1: image is too large")):
        with pytest.raises(MlflowException, match=message) as info:
            model.predict(None, frame)
        assert info.value.get_http_status_code() == 400


def test_payload_names_every_bad_row() -> None:
    frame = frame_of(b64(GOOD_PNG), "@@", b64(GOOD_PNG), b64(b"GIF89a"), b64(png_bytes(9000, 9000)))
    with pytest.raises(ValueError) as info:
        decode_payload(frame, (1, 16, 16))
    message = str(info.value)
    assert message.startswith("3 of 5 rows are bad: row 1: image is not valid base64; ")
    assert "; row 3: image cannot be decoded: not a PNG or JPEG" in message
    assert "; row 4: image is too large: 9000 x 9000" in message
    assert "row 0" not in message and "row 2" not in message
    many = frame_of(*(["@@"] * 25))
    listed = r"^25 of 25 rows are bad: row 0: .*; row 9: [^;]*; and 15 more bad rows$"  # rows 10.. counted
    with pytest.raises(ValueError, match=listed):
        decode_payload(many, (1, 16, 16))


def test_request_size_counts_pixel_values() -> None:
    """A ``pixels`` row weighs one byte a value, as an array or as nested lists, before any row is read."""
    arrays = [np.zeros((3, 20, 30), np.uint8), np.zeros((16, 16), np.int64).tolist()]
    frame = frame_of(*arrays, column="pixels")
    size = 3 * 20 * 30 + 16 * 16
    assert decode_payload(frame, (1, 16, 16), max_bytes=size).shape == (2, 1, 16, 16)
    message = f"holds {size:,} bytes of image data, over the limit of {size - 1:,}"
    with pytest.raises(ValueError, match=message):
        decode_payload(frame, (1, 16, 16), max_bytes=size - 1)
    with pytest.raises(ValueError, match="over the limit of 8,388,608 bytes"):  # the default, 8 MiB
        decode_payload(frame_of(np.zeros((1, 4097, 4096), np.uint8), column="pixels"), (1, 16, 16))


def test_16bit_pixel_values_point_to_the_image_column() -> None:
    frame = frame_of(np.full((4, 4), 257 * 9, np.uint16), column="pixels")
    message = r"row 0: pixels must lie in 0\.\.255, got 2313\.\.2313 \(send 16-bit images as PNG"
    with pytest.raises(ValueError, match=message):
        decode_payload(frame, (1, 16, 16))
