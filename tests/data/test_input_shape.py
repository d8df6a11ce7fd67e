"""``data.image_size: auto`` / ``data.channels: auto``: the input shape read from the data, said aloud."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.data.input_shape import (
    AUTO_MAX_SIZE,
    AUTO_MIN_SIZE,
    carries_colour,
    choose_input,
    resolve_input,
    sample_files,
)
from pipeline.data.sources import DataError
from pipeline.models.config import STRIDE_ABOVE, STRIDE_EXTRA_LAYERS, ModelConfig
from pipeline.params.config import deep_merge, load_params
from pipeline.params.schema import check_params


def folder(root: Path, size: tuple[int, int], colour: bool, per_class: int = 4, jpeg: bool = False) -> Path:
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            grey = rng.integers(0, 256, (size[1], size[0]), dtype=np.uint8)
            pixels = (
                rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
                if colour
                else np.repeat(grey[..., None], 3, axis=2)
            )  # grey stored as RGB: still grey
            Image.fromarray(pixels).save(root / c / f"{i}.{'jpg' if jpeg else 'png'}")
    return root


def test_a_colour_folder_is_read_in_colour_at_its_own_size(tmp_path):
    choice = resolve_input(f"imagefolder:{folder(tmp_path / 'f', (48, 40), True)}", "auto", "auto")
    assert (choice.channels, choice.image_size) == (3, 40)  # the shorter side
    assert choice.reason.startswith("input 3x40x40: size 40 (auto") and "colour (auto: 100%" in choice.reason


def test_grey_pictures_saved_as_rgb_jpeg_stay_grey(tmp_path):
    choice = resolve_input(
        f"imagefolder:{folder(tmp_path / 'f', (30, 30), False, jpeg=True)}", "auto", "auto"
    )
    assert choice.channels == 1 and choice.colour_share == 0.0


def test_the_size_is_capped_and_floored(tmp_path):
    big = resolve_input(f"imagefolder:{folder(tmp_path / 'big', (200, 150), False)}", "auto", "auto")
    assert big.image_size == AUTO_MAX_SIZE and "capped at 64" in big.reason
    assert resolve_input("digits", "auto", "auto").image_size == AUTO_MIN_SIZE  # 8 px digits raised


def test_params_win_and_a_reduction_is_said(tmp_path):
    source = f"imagefolder:{folder(tmp_path / 'f', (48, 48), True)}"
    choice = resolve_input(source, 28, 1)
    assert (choice.channels, choice.image_size) == (1, 28)
    assert "colour dropped" in choice.reason and "shrunk" in choice.reason


def test_idx_sources_are_grey_at_their_size():
    choice = resolve_input("fashion-mnist", "auto", "auto")
    assert (choice.channels, choice.image_size) == (1, 28)
    assert resolve_input("fashion-mnist", "auto", 3).channels == 1


def test_choose_input_is_pure():
    assert choose_input("auto", "auto", 100, 0.5, "x").to_json()["shape"] == [3, 64, 64]
    assert choose_input("auto", "auto", 20, 0.05, "x").to_json()["shape"] == [1, 20, 20]  # 5% colour: grey


def test_carries_colour_needs_more_than_noise():
    grey = np.full((3, 10, 10), 100, dtype=np.uint8)
    noisy = grey.copy()
    noisy[0, 0, 0] = 200  # one pixel of 100: under the share
    assert not carries_colour(grey) and not carries_colour(noisy)
    grey[0] = 200
    assert carries_colour(grey)


def test_the_sample_is_spread_and_deterministic(tmp_path):
    root = folder(tmp_path / "f", (8, 8), False, per_class=300)
    files = sample_files(root, sample=10)
    assert files == sample_files(root, sample=10) and len(files) == 10
    assert {p.parent.name for p in files} == {"a", "b"}


def test_a_corrupt_file_is_named(tmp_path):
    root = folder(tmp_path / "f", (8, 8), False, per_class=1)
    (root / "a" / "0.png").write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"a/0.png cannot be decoded"):
        resolve_input(f"imagefolder:{root}", "auto", "auto")


def test_auto_is_valid_params_and_a_typo_is_not():
    params = load_params("params.yaml")
    assert params["data"]["image_size"] == "auto" and not check_params_problems(params)
    assert "data.image_size must be 'auto' or an int" in " ".join(
        check_params_problems(deep_merge(params, {"data": {"image_size": "autoo"}}))
    )


def check_params_problems(params: dict) -> list[str]:
    try:
        check_params(params)
    except Exception as exc:  # ParamsError lists every problem
        return [str(exc)]
    return []


def test_module_1_strides_on_large_images_only():
    model = ModelConfig.from_params(load_params("params.yaml"))
    assert model.for_input(28) is model and model.for_input(STRIDE_ABOVE) is model
    assert model.for_input(48).specs[0].stride == 2 and model.for_input(48).specs[1:] == model.specs[1:]
    assert model.for_input(48).specs[0].layers == model.specs[0].layers + STRIDE_EXTRA_LAYERS > model.specs[0].layers
    assert model.cascade_spec(3, 5, 64).modules[0].stride == 2


def test_a_module_1_that_pools_is_left_as_params_give_it_on_large_images():
    params = deep_merge(load_params("params.yaml"), {"modules": {"m1": {"spec": {"layers": 3, "pools": 2}}}})
    model = ModelConfig.from_params(params)
    assert model.for_input(64) is model and model.cascade_spec(3, 5, 64).modules[0].stride == 1


def test_a_folder_of_webp_bmp_and_tiff_is_sampled_like_png(tmp_path):
    root = folder(tmp_path / "f", (48, 40), True)
    for i, path in enumerate(sorted(root.rglob("*.png"))):
        Image.open(path).save(path.with_suffix((".webp", ".bmp", ".tiff")[i % 3]), lossless=True)
        path.unlink()
    (root / "a" / "notes.txt").write_text("not sampled")
    choice = resolve_input(f"imagefolder:{root}", "auto", "auto")
    assert (choice.channels, choice.image_size) == (3, 40) and "8 sampled images" in choice.reason
