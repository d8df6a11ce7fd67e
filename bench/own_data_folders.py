"""The image folders of ``bench.own_data``: the kinds of data a user brings, built from what is on this
machine (Fashion-MNIST from its Debian package, scikit-learn's digits, drawn scenes), deterministic for
a seed. One sub-folder per class, PNG or JPEG inside, as ``imagefolder:<dir>`` reads them.

    python -m bench.own_data_folders --out /tmp/folders            # all five
    python -m bench.own_data_folders --out /tmp/folders --only scenes-colour-64

- shop-colour-48: 1,550 JPEG, 48 px RGB, 5 garment classes unbalanced 500/400/300/200/150 (one name
  with a space, one with a non-ASCII letter): the issue's folder; colour and size must not be dropped.
- fashion-grey-28: 2,100 PNG, 28 px grey, 6 confusable garments unbalanced 600/450/350/300/250/150.
- digits-grey-32: 1,797 PNG, 32 px grey (upscaled from 8 px, noise added), 10 balanced classes: easy.
- scenes-colour-64: 2,400 PNG, 64 px RGB, 6 shapes balanced: hard, a small shape off-centre in clutter.
- occluded-colour-48: 2,400 PNG, 48 px RGB, 8 garments balanced, each half hidden behind 2-4 opaque
  patches of random colour and noise: hard of another kind (a large object, partly seen; similar
  garments told apart by what shows).
"""

from __future__ import annotations

import argparse
import colorsys
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SHOP_CLASSES = {
    0: ("t shirt", 500),
    1: ("trouser", 400),
    2: ("pullover", 300),
    3: ("dréss", 200),
    4: ("coat", 150),
}
FASHION_CLASSES = {
    0: ("t-shirt", 600),
    2: ("pullover", 450),
    4: ("coat", 350),
    6: ("shirt", 300),
    3: ("dress", 250),
    8: ("bag", 150),
}
OCCLUDED_CLASSES = {label: (name, 300) for label, name in enumerate(
    ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker"))}
SHAPES = ("circle", "square", "triangle", "cross", "ring", "frame")
SCENES_PER_CLASS = 400
# The third hard folder: eight shapes, smaller and among more clutter than the scenes', 300 of each
# (docs/RESULTS.md "Your own images": a folder where plain_large led the hand-shaped cascade).
SMALL_SHAPES = (*SHAPES, "diamond", "star")
SMALL_PER_CLASS = 300


def _fashion_rows(
    classes: dict[int, tuple[str, int]], rng: np.random.Generator
) -> list[tuple[str, np.ndarray]]:
    from pipeline.data.sources import load_fashion_mnist

    data = load_fashion_mnist()
    out = []
    for label, (name, count) in classes.items():
        rows = rng.choice(np.flatnonzero(data.train.labels == label), size=count, replace=False)
        out.extend((name, data.train.images[r, 0]) for r in sorted(rows))
    return out


def _colour(rng: np.random.Generator, light: tuple[float, float]) -> np.ndarray:
    r, g, b = colorsys.hsv_to_rgb(rng.random(), rng.uniform(0.4, 1.0), rng.uniform(*light))
    return np.array([r, g, b]) * 255.0


def colourise(grey: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """A (28, 28) grey garment as an RGB (size, size) picture: a random dark backdrop, a random bright
    fabric colour (class-independent, so colour carries no label), slight noise."""
    alpha = np.asarray(Image.fromarray(grey).resize((size, size), Image.BILINEAR), dtype=np.float64) / 255.0
    back, fabric = _colour(rng, (0.1, 0.4)), _colour(rng, (0.7, 1.0))
    rgb = back * (1 - alpha[..., None]) + fabric * alpha[..., None] + rng.normal(0, 6, (size, size, 3))
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill: tuple) -> None:
    box = (cx - r, cy - r, cx + r, cy + r)
    width = max(2, int(r / 2.5))
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    elif shape == "cross":
        draw.rectangle((cx - r, cy - width / 2, cx + r, cy + width / 2), fill=fill)
        draw.rectangle((cx - width / 2, cy - r, cx + width / 2, cy + r), fill=fill)
    elif shape == "ring":
        draw.ellipse(box, outline=fill, width=width)
    elif shape == "frame":
        draw.rectangle(box, outline=fill, width=width)
    elif shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=fill)
    elif shape == "star":
        angles = [math.pi * (0.5 + 0.4 * i) for i in range(10)]
        radii = [r if i % 2 == 0 else r * 0.45 for i in range(10)]
        draw.polygon([(cx + q * math.cos(a), cy - q * math.sin(a)) for a, q in zip(angles, radii, strict=True)],
                     fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}")


def scene(shape: str, size: int, rng: np.random.Generator, radius: tuple[float, float] = (6, 11),
          clutter_count: tuple[int, int] = (4, 9)) -> np.ndarray:
    """One (size, size, 3) scene: a textured backdrop, clutter (strokes and dots in random colours) and
    one small ``shape`` (``radius`` 6-11 px at 64 px by default) anywhere off the border, a few strokes drawn over it.
    (Radius 4-8 under more clutter left every model of the quick profile at chance: 17-27% for 6
    classes.)"""
    base = _colour(rng, (0.2, 0.7))
    img = Image.fromarray(np.clip(base + rng.normal(0, 18, (size, size, 3)), 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    scale = size / 64

    def clutter(n: int) -> None:
        for _ in range(n):
            c = tuple(int(v) for v in _colour(rng, (0.2, 1.0)))
            x, y = rng.uniform(0, size, 2)
            if rng.random() < 0.6:
                dx, dy = rng.normal(0, 10 * scale, 2)
                draw.line((x, y, x + dx, y + dy), fill=c, width=int(rng.integers(1, 3)))
            else:
                d = rng.uniform(1, 3) * scale
                draw.ellipse((x - d, y - d, x + d, y + d), fill=c)

    clutter(int(rng.integers(clutter_count[0], clutter_count[1] + 1)))
    r = rng.uniform(*radius) * scale
    cx, cy = rng.uniform(r + 2, size - r - 2, 2)
    _draw_shape(draw, shape, cx, cy, r, tuple(int(v) for v in _colour(rng, (0.5, 1.0))))
    clutter(int(rng.integers(0, 3)))
    return np.asarray(img)


def occlude(rgb: np.ndarray, rng: np.random.Generator, patches: tuple[int, int] = (2, 4),
            side: tuple[float, float] = (0.25, 0.45)) -> np.ndarray:
    """``rgb`` (size, size, 3) with 2-4 opaque patches (rectangles or ellipses, sides 25-45% of the image,
    a random colour plus noise) centred in the middle half, where the garment is: about half of it hidden."""
    size = rgb.shape[0]
    img = Image.fromarray(rgb)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(patches[0], patches[1] + 1))):
        w, h = rng.uniform(*side, 2) * size
        cx, cy = rng.uniform(0.25, 0.75, 2) * size
        box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
        fill = tuple(int(v) for v in _colour(rng, (0.1, 1.0)))
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)(box, fill=fill)
    noisy = np.asarray(img, dtype=np.float64) + rng.normal(0, 6, rgb.shape)
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def _save(folder: Path, name: str, index: int, pixels: np.ndarray, suffix: str) -> None:
    out = folder / name
    out.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(pixels)
    if suffix == ".jpg":
        image.save(out / f"{index:04d}.jpg", quality=92)
    else:
        image.save(out / f"{index:04d}.png")


def make_shop(folder: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    for i, (name, grey) in enumerate(_fashion_rows(SHOP_CLASSES, rng)):
        _save(folder, name, i, colourise(grey, 48, rng), ".jpg")
    return folder


def make_fashion_grey(folder: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed + 1)
    for i, (name, grey) in enumerate(_fashion_rows(FASHION_CLASSES, rng)):
        _save(folder, name, i, grey, ".png")
    return folder


def make_digits(folder: Path, seed: int) -> Path:
    from sklearn.datasets import load_digits

    rng = np.random.default_rng(seed + 2)
    bunch = load_digits()
    for i, (img, label) in enumerate(zip(bunch.images, bunch.target, strict=True)):
        grey = Image.fromarray(np.clip(img * 255 / 16, 0, 255).astype(np.uint8)).resize(
            (32, 32), Image.BICUBIC
        )
        noisy = np.clip(np.asarray(grey, dtype=np.float64) + rng.normal(0, 8, (32, 32)), 0, 255)
        _save(folder, f"digit {label}", i, noisy.astype(np.uint8), ".png")
    return folder


def make_scenes(folder: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed + 3)
    for c, shape in enumerate(SHAPES):
        for j in range(SCENES_PER_CLASS):
            _save(folder, shape, c * SCENES_PER_CLASS + j, scene(shape, 64, rng), ".png")
    return folder


def make_small_objects(folder: Path, seed: int) -> Path:
    """Eight shapes of radius 5-9 px anywhere on 64 px scenes under 6-11 clutter strokes: the objects are a
    few percent of the image, so a model must keep fine detail everywhere (what a pooled 8-channel first
    module drops)."""
    rng = np.random.default_rng(seed + 5)
    for c, shape in enumerate(SMALL_SHAPES):
        for j in range(SMALL_PER_CLASS):
            pixels = scene(shape, 64, rng, radius=(5, 9), clutter_count=(6, 11))
            _save(folder, shape, c * SMALL_PER_CLASS + j, pixels, ".png")
    return folder


def make_occluded(folder: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed + 4)
    for i, (name, grey) in enumerate(_fashion_rows(OCCLUDED_CLASSES, rng)):
        _save(folder, name, i, occlude(colourise(grey, 48, rng), rng), ".png")
    return folder


FOLDERS: dict[str, Callable[[Path, int], Path]] = {
    "shop-colour-48": make_shop,
    "fashion-grey-28": make_fashion_grey,
    "digits-grey-32": make_digits,
    "scenes-colour-64": make_scenes,
    "occluded-colour-48": make_occluded,
    "small-objects-colour-64": make_small_objects,
}


def make_folder(name: str, root: Path, seed: int = 0) -> Path:
    """Build folder ``name`` under ``root`` (kept if it is already there and complete)."""
    if name not in FOLDERS:
        raise SystemExit(f"unknown folder {name!r}; known: {', '.join(FOLDERS)}")
    folder = root / name
    done = folder / ".complete"
    if done.is_file():
        return folder
    FOLDERS[name](folder, seed)
    done.write_text("ok\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="where the folders are written")
    p.add_argument(
        "--only", nargs="*", default=list(FOLDERS), help=f"folders (default all: {', '.join(FOLDERS)})"
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in args.only:
        print(make_folder(name, args.out, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
