"""``pipeline.routing.recognize``: answering with a loaded cascade. ``recognize_arrays`` (one row per
image: class index and name, confidence, 1-based exit, ``fixed`` / the arch key / ``-`` per module,
MACs; independent of the batch size), ``recognize_files`` (bounded batches, the order kept, a missing
or oversized file an error entry, a non-square model refused) and ``collect_image_paths`` (folders
expanded recursively and sorted, suffixes in any case, a named file kept whatever its suffix, an empty
folder or a missing path an error entry). ``preprocess`` per channel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pipeline.routing import recognize
from pipeline.routing.engine import run_cascade
from pipeline.routing.package import CascadeMeta, LoadedCascade
from pipeline.routing.recognize import (
    FIXED_PATH,
    NOT_REACHED,
    collect_image_paths,
    preprocess,
    recognize_arrays,
    recognize_files,
)

META = CascadeMeta(("ant", "bee", "cat", "dog"), (1, 16, 16), (0.5,), (0.25,))
THRESHOLDS = (0.5, 0.5)  # on IMAGES, some leave at exit 1 and the rest reach module 3


@pytest.fixture
def loaded(tiny) -> LoadedCascade:  # noqa: ANN001 - the tiny cascade of tests/routing/conftest.py
    return LoadedCascade(tiny.with_thresholds(THRESHOLDS), META)


def uint8_images(n: int, seed: int = 1, size: int = 16) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = rng.uniform(5, 120, size=(n, 1, 1, 1))  # per-image contrast: confidences (and exits) vary
    return np.clip(128 + rng.standard_normal((n, 1, size, size)) * scale, 0, 255).astype(np.uint8)


def write_png(path: Path, size: tuple[int, int], seed: int = 0) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format="PNG")
    return path


def test_rows_say_what_the_engine_did(loaded: LoadedCascade) -> None:
    images = uint8_images(24)
    rows = recognize_arrays(loaded, images)
    out = run_cascade(loaded.stages, preprocess(images, META))
    assert len(rows) == 24
    keys = [[a.key() for a in stage.candidates] for stage in loaded.stages]
    for i, row in enumerate(rows):
        assert set(row) == {"class_index", "class_name", "confidence", "exit", "subnets", "macs"}
        assert row["class_index"] == int(out.pred[i])
        assert row["class_name"] == META.classes[row["class_index"]]
        assert row["exit"] == int(out.exit_index[i]) + 1  # 1-based
        assert row["confidence"] == pytest.approx(float(out.conf[i]))
        assert row["macs"] == int(out.macs[i]) and isinstance(row["macs"], int)
        assert row["subnets"][0] == FIXED_PATH  # the fixed module's arch key is empty
        for k in range(1, 3):
            c = int(out.choices[i, k])
            assert row["subnets"][k] == (NOT_REACHED if c < 0 else keys[k][c])
        assert all(s == NOT_REACHED for s in row["subnets"][row["exit"]:])  # nothing ran after the exit
    assert {r["exit"] for r in rows} == {1, 3}  # both an early exit and the last module answered
    assert {r["subnets"][2] for r in rows if r["exit"] == 3} == set(keys[2])  # routed per image


def same_rows(a: list[dict], b: list[dict]) -> bool:
    """Equal rows, confidences to float32 rounding (a batch of another size may round differently)."""
    def strip(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "confidence"} for r in rows]

    confidences = [r["confidence"] for r in b]
    return strip(a) == strip(b) and [r["confidence"] for r in a] == pytest.approx(confidences)


def test_rows_do_not_depend_on_the_batch_size(loaded: LoadedCascade) -> None:
    images = uint8_images(10)
    assert same_rows(recognize_arrays(loaded, images, batch_size=3), recognize_arrays(loaded, images))


def test_preprocess_normalises_each_channel_with_its_own_statistics() -> None:
    meta = CascadeMeta(("a", "b"), (3, 2, 2), (0.0, 0.5, 1.0), (1.0, 0.5, 0.25))
    images = np.full((1, 3, 2, 2), 255, dtype=np.uint8)
    assert preprocess(images, meta)[0, :, 0, 0].tolist() == pytest.approx([1.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"uint8 \(N, 3, 2, 2\), got uint8 \(3, 2, 2\)"):
        preprocess(images[0], meta)  # one image without its batch axis


def test_recognize_files_refuses_a_non_square_model(tiny) -> None:  # noqa: ANN001
    meta = CascadeMeta(("ant", "bee", "cat", "dog"), (1, 16, 12), (0.5,), (0.25,))
    with pytest.raises(ValueError, match="square model input, the model takes 16x12"):
        recognize_files(LoadedCascade(tiny.stages, meta), [])


def test_recognize_files_in_bounded_batches_keeps_the_order(loaded: LoadedCascade, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    good = [write_png(tmp_path / f"{i}.png", (16 + 4 * i, 16 + 4 * i), seed=i) for i in range(5)]
    big = write_png(tmp_path / "big.png", (40, 40))
    missing = tmp_path / "missing.png"
    paths = [good[0], missing, good[1], good[2], big, good[3], good[4]]
    seen: list[int] = []
    real = recognize.recognize_arrays

    def spy(loaded_: LoadedCascade, batch: np.ndarray, batch_size: int = 256) -> list[dict]:
        seen.append(len(batch))
        return real(loaded_, batch, batch_size)

    monkeypatch.setattr(recognize, "recognize_arrays", spy)
    rows, errors = recognize_files(loaded, paths, batch_size=2, max_pixels=36 * 36)
    assert seen == [2, 2, 1]  # decoded and answered two files at a time
    assert [r["path"] for r in rows] == [str(p) for p in good]
    assert [e["path"] for e in errors] == [str(missing), str(big)]
    assert str(missing) in errors[0]["error"] and "40" in errors[1]["error"]
    arrays = np.stack([recognize.decode_image_file(p, 1, 16) for p in good])
    assert same_rows([{k: v for k, v in r.items() if k != "path"} for r in rows], real(loaded, arrays))


def test_recognize_files_with_nothing_to_answer(loaded: LoadedCascade, tmp_path: Path) -> None:
    assert recognize_files(loaded, []) == ([], [])
    rows, errors = recognize_files(loaded, [tmp_path / "a.png"])
    assert rows == [] and [e["path"] for e in errors] == [str(tmp_path / "a.png")]


def test_collect_expands_folders_recursively_and_sorted(tmp_path: Path) -> None:
    for name in ("b.png", "A.PNG", "sub/c.JPG", "sub/deeper/d.jpeg"):
        write_png(tmp_path / "imgs" / name, (4, 4))
    for name in ("sub/e.pdf", "notes.txt"):  # no suffix of a format Pillow reads: left out of a folder
        (tmp_path / "imgs" / name).write_text("x")
    files, errors = collect_image_paths([tmp_path / "imgs"])
    rel = [p.relative_to(tmp_path / "imgs").as_posix() for p in files]
    assert rel == ["A.PNG", "b.png", "sub/c.JPG", "sub/deeper/d.jpeg"] and errors == []


def test_collect_keeps_named_files_and_names_what_it_cannot_use(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image")
    (tmp_path / "empty").mkdir()
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("x")
    png = write_png(tmp_path / "one.png", (4, 4))
    files, errors = collect_image_paths([str(notes), tmp_path / "empty", tmp_path / "texts", png,
                                         tmp_path / "gone", png])
    assert files == [notes, png, png]  # as given, in order, a repeat kept
    assert errors == [
        {"path": str(tmp_path / "empty"), "error": "folder holds no PNG/JPEG images"},
        {"path": str(tmp_path / "texts"), "error": "folder holds no PNG/JPEG images"},
        {"path": str(tmp_path / "gone"), "error": "no such file or folder"},
    ]


def test_recognize_arrays_runs_on_the_cascades_device(loaded: LoadedCascade) -> None:
    assert recognize._device_of(loaded) == torch.device("cpu")
