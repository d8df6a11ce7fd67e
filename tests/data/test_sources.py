import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.data.sources import DataError, load_digits, load_idx_dir, load_imagefolder, load_source, read_idx


def write_idx(path: Path, array: np.ndarray, compress: bool = True) -> Path:
    code = {np.dtype(np.uint8): 0x08}[array.dtype]
    header = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    raw = header + array.tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return path


def make_idx_dir(root: Path, n_train=30, n_test=10, n_classes=3, label_override=None) -> Path:
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 6, 6), dtype=np.uint8))
        labels = (np.arange(n) % n_classes).astype(np.uint8)
        if label_override is not None and prefix == "train":
            labels[3] = label_override
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return root


def test_read_idx_roundtrip(tmp_path):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    assert np.array_equal(read_idx(write_idx(tmp_path / "a.gz", array)), array)
    assert np.array_equal(read_idx(write_idx(tmp_path / "a", array, compress=False)), array)


def test_truncated_idx_names_the_file(tmp_path):
    path = write_idx(tmp_path / "x-images-idx3-ubyte", np.zeros((5, 4, 4), np.uint8), compress=False)
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(DataError, match="x-images-idx3-ubyte.*truncated"):
        read_idx(path)


def test_garbled_gzip_names_the_file(tmp_path):
    path = tmp_path / "bad.gz"
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x01" + b"\x00\x00\x00\x05" + b"abcde")[:-5])
    with pytest.raises(DataError, match="bad.gz"):
        read_idx(path)


def test_bad_magic(tmp_path):
    path = tmp_path / "junk"
    path.write_bytes(b"PNG\x00 this is not idx")
    with pytest.raises(DataError, match="magic"):
        read_idx(path)


def test_idx_dir_loads_and_ids_are_stable(tmp_path):
    data = load_idx_dir(make_idx_dir(tmp_path))
    assert data.train.images.shape == (30, 1, 6, 6)
    assert data.test.images.shape == (10, 1, 6, 6)
    assert data.train.ids[0] == "train-00000" and data.test.ids[-1] == "test-00009"
    assert data.classes == ("0", "1", "2")


def test_label_outside_class_set(tmp_path):
    make_idx_dir(tmp_path, label_override=200)
    with pytest.raises(DataError, match="outside the class set.*index 3 has label 200"):
        load_source(f"fashion-mnist:{tmp_path}", channels=1, image_size=6)


def test_digits_are_resized_uint8():
    data = load_digits(16)
    assert data.train.images.shape[1:] == (1, 16, 16)
    assert data.train.images.dtype == np.uint8 and data.train.images.max() > 200
    assert data.test is None


def make_folder(root: Path) -> Path:
    for name, colour in (("cat", (200, 30, 30)), ("dog", (30, 30, 200))):
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (40 + i, 30), colour).save(root / name / f"{i}.png")
        Image.new("L", (10, 10), 128).save(root / name / "gray.jpg")
    return root


def test_imagefolder_any_size_and_mode(tmp_path):
    data = load_imagefolder(make_folder(tmp_path / "imgs"), channels=1, image_size=12)
    assert data.classes == ("cat", "dog")
    assert data.train.images.shape == (8, 1, 12, 12)
    assert "cat/0.png" in set(data.train.ids)
    rgb = load_imagefolder(tmp_path / "imgs", channels=3, image_size=12)
    assert rgb.train.images.shape == (8, 3, 12, 12)


def test_imagefolder_corrupt_file_is_named(tmp_path):
    root = make_folder(tmp_path / "imgs")
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(DataError, match="broken.png"):
        load_imagefolder(root, channels=1, image_size=12)


def test_imagefolder_empty_class_is_named(tmp_path):
    root = make_folder(tmp_path / "imgs")
    (root / "empty").mkdir()
    with pytest.raises(DataError, match="empty.*no PNG/JPEG"):
        load_imagefolder(root, channels=1, image_size=12)


def test_unknown_source():
    with pytest.raises(DataError, match="unknown data source 'mnist-ish'"):
        load_source("mnist-ish", channels=1, image_size=28)
