import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.data.sources import (
    DataError,
    load_digits,
    load_idx_dir,
    load_imagefolder,
    load_source,
    read_idx,
    skipped_note,
)


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


def test_idx_label_outside_the_mnist_class_set_is_named(tmp_path):
    """Without a classes file an `idx:` source has at most MNIST's 10 classes: label 200 is an error
    naming the file, the row and the value (it used to make 201 classes, 191 of them empty)."""
    make_idx_dir(tmp_path, label_override=200)
    labels_file = tmp_path / "train-labels-idx1-ubyte.gz"
    with pytest.raises(DataError, match=f"IDX file {labels_file}: 1 labels outside the class set 0..9, "
                                        "e.g. index 3 has label 200 .*classes.txt"):
        load_source(f"idx:{tmp_path}", channels=1, image_size=6)


def test_idx_test_label_outside_the_training_classes_is_named(tmp_path):
    make_idx_dir(tmp_path)  # 3 classes: 0..2
    labels = (np.arange(10) % 3).astype(np.uint8)
    labels[7] = 5
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels)
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz: 1 labels outside the class set 0..2, "
                                        "e.g. index 7 has label 5"):
        load_idx_dir(tmp_path)


def test_idx_classes_file_sets_the_class_set(tmp_path):
    make_idx_dir(tmp_path, n_classes=3, label_override=11)
    names = [f"letter {chr(65 + i)}" for i in range(12)]
    (tmp_path / "classes.txt").write_text("\n".join(names) + "\n")
    data = load_source(f"idx:{tmp_path}", channels=1, image_size=6)
    assert data.classes == tuple(names) and data.train.labels[3] == 11
    (tmp_path / "classes.txt").write_text("\n".join(names[:11]) + "\n")  # label 11 is now outside
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.gz: 1 labels outside the class set 0..10, "
                                        "e.g. index 3 has label 11 .*classes listed in"):
        load_idx_dir(tmp_path)


@pytest.mark.parametrize(("text", "message"), [
    ("a\n\nb\n", "line 2 is blank"),
    ("a\nb\na\n", "line 3 repeats class 'a' of line 1"),
    ("\n", "names no class"),
])
def test_idx_bad_classes_file_is_named(tmp_path, text, message):
    make_idx_dir(tmp_path)
    (tmp_path / "classes.txt").write_text(text)
    with pytest.raises(DataError, match=f"classes file {tmp_path / 'classes.txt'}.*{message}"):
        load_idx_dir(tmp_path)


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


def test_imagefolder_nested_folder_is_refused_not_merged(tmp_path):
    """`animals/{cats,dogs}` used to become one class `animals`; now the nested folder is named."""
    root = make_folder(tmp_path / "imgs")
    for sub in ("cats", "dogs"):
        (root / "animals" / sub).mkdir(parents=True)
        Image.new("L", (8, 8), 50).save(root / "animals" / sub / "0.png")
    with pytest.raises(DataError, match=f"class folder {root / 'animals'} holds a sub-folder "
                                        f"{root / 'animals' / 'cats'} \\(and 1 more\\)"):
        load_imagefolder(root, channels=1, image_size=12)


def test_imagefolder_nested_folder_is_found_before_decoding(tmp_path):
    root = make_folder(tmp_path / "imgs")
    (root / "cat" / "broken.png").write_bytes(b"not an image")  # would fail first if decoding came first
    (root / "dog" / "puppies").mkdir()
    with pytest.raises(DataError, match="holds a sub-folder .*puppies"):
        load_imagefolder(root, channels=1, image_size=12)


def test_imagefolder_hidden_sub_folder_is_skipped(tmp_path):
    root = make_folder(tmp_path / "imgs")
    (root / "cat" / ".ipynb_checkpoints").mkdir()
    Image.new("L", (8, 8), 50).save(root / "cat" / ".ipynb_checkpoints" / "0-checkpoint.png")
    data = load_imagefolder(root, channels=1, image_size=12)
    assert data.classes == ("cat", "dog") and len(data.train) == 8


def test_imagefolder_empty_class_is_named(tmp_path):
    root = make_folder(tmp_path / "imgs")
    (root / "empty").mkdir()
    with pytest.raises(DataError, match="empty.*no images"):
        load_imagefolder(root, channels=1, image_size=12)


def test_unknown_source():
    with pytest.raises(DataError, match="unknown data source 'mnist-ish'"):
        load_source("mnist-ish", channels=1, image_size=28)



def test_class_names_are_nfc_and_free_of_control_characters(tmp_path: Path) -> None:
    from pipeline.data.sources import DataError, class_name, load_imagefolder

    assert class_name("cafe\u0301", "here") == "caf\u00e9"  # NFD -> NFC: one class
    with pytest.raises(DataError, match=r"here: class name 'a\\tb' holds control characters"):
        class_name("a\tb", "here")
    for folder in ("caf\u00e9", "cafe\u0301", "tea"):  # the same name in NFC and in NFD
        (tmp_path / folder).mkdir()
        Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(tmp_path / folder / "a.png")
    with pytest.raises(DataError, match="differ only in their Unicode form"):
        load_imagefolder(tmp_path, 1, 8)


# ---------------------------------------------------------------- every file of an image folder accounted for


def mixed_folder(root: Path) -> Path:
    """Two classes in WebP, BMP, TIFF and GIF (each a flat grey whose value says its file), beside a stray
    text file, a macOS .DS_Store, an EPS (Pillow runs Ghostscript for it), a README next to the class
    folders and a hidden folder."""
    values = {"cat/a.webp": 10, "cat/b.BMP": 60, "cat/c.tiff": 110, "dog/d.tif": 160, "dog/e.gif": 210,
              "dog/f.webp": 250}
    for name, value in values.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        extra = {"lossless": True} if name.endswith(".webp") else {}
        Image.new("L", (9, 7), value).save(root / name, **extra)
    (root / "cat" / "notes.txt").write_text("taken on Tuesday")
    (root / "cat" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (root / "dog" / "logo.eps").write_text("%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n")
    (root / "README.md").write_text("my pets")
    (root / ".git").mkdir()
    return root


def test_imagefolder_reads_every_pillow_format_and_names_what_it_skips(tmp_path):
    data = load_imagefolder(mixed_folder(tmp_path / "imgs"), channels=1, image_size=9)
    ids = list(data.train.ids)
    assert sorted(ids) == ["cat/a.webp", "cat/b.BMP", "cat/c.tiff", "dog/d.tif", "dog/e.gif", "dog/f.webp"]
    expected = {"cat/a.webp": 10, "cat/b.BMP": 60, "cat/c.tiff": 110, "dog/d.tif": 160, "dog/e.gif": 210,
                "dog/f.webp": 250}
    for name, value in expected.items():
        assert (data.train.images[ids.index(name)] == value).all(), name
    assert data.skipped == (".git/", "README.md", "cat/.DS_Store", "cat/notes.txt", "dog/logo.eps")


def test_imagefolder_of_png_and_jpeg_skips_nothing(tmp_path):
    assert load_imagefolder(make_folder(tmp_path / "imgs"), channels=1, image_size=12).skipped == ()
    assert load_digits(8).skipped is None  # no folder, nothing to account for


def test_imagefolder_hidden_sub_folder_is_named_as_skipped(tmp_path):
    root = make_folder(tmp_path / "imgs")
    (root / "cat" / ".ipynb_checkpoints").mkdir()
    Image.new("L", (8, 8), 50).save(root / "cat" / ".ipynb_checkpoints" / "0-checkpoint.png")
    assert load_imagefolder(root, channels=1, image_size=12).skipped == ("cat/.ipynb_checkpoints/",)


@pytest.mark.parametrize("name", ["broken.webp", "broken.bmp", "broken.tiff", "text.gif"])
def test_imagefolder_refuses_an_undecodable_file_of_an_image_suffix_by_name(tmp_path, name):
    root = mixed_folder(tmp_path / "imgs")
    good = {"broken.webp": "cat/a.webp", "broken.bmp": "cat/b.BMP", "broken.tiff": "cat/c.tiff"}
    bad = root / "dog" / name
    bad.write_bytes((root / good[name]).read_bytes()[:20] if name in good else b"just some words")
    with pytest.raises(DataError, match=f"image file {bad} cannot be decoded"):
        load_imagefolder(root, channels=1, image_size=9)


def test_an_image_less_class_folder_says_what_it_holds(tmp_path):
    root = make_folder(tmp_path / "imgs")
    (root / "notes").mkdir()
    (root / "notes" / "a.txt").write_text("x")
    with pytest.raises(DataError, match=r"notes holds no images \(PNG, JPEG, WebP.*; it holds a.txt$"):
        load_imagefolder(root, channels=1, image_size=12)


def test_the_skipped_note_names_ten_and_counts_the_rest():
    assert skipped_note(None, "m.json") == "" and skipped_note((), "m.json") == ""
    assert skipped_note(("a.txt",), "m.json") == "; skipped 1 (not images): a.txt"
    note = skipped_note(tuple(f"{i}.txt" for i in range(12)), "m.json")
    assert note.endswith("9.txt and 2 more (all in m.json 'skipped')") and "10.txt" not in note
