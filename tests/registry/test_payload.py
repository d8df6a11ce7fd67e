"""Request limits of the served model (pipeline.registry.payload): a request is refused from its headers before
any pixel is decoded when its images declare more pixels in all than the per-request budget."""

from __future__ import annotations

import base64
import time

import numpy as np
import pandas as pd
import pytest

from pipeline.registry.payload import MAX_REQUEST_BYTES, MAX_REQUEST_PIXELS, decode_payload, encode_png


def test_a_request_of_small_files_declaring_huge_images_is_refused_before_decoding() -> None:
    """A 4096 x 4096 black PNG is about 16 KB of base64; 384 copies fit under the 8 MiB byte limit and
    declare 6.4 G pixels (the kind of request that once tied the server up for 60 s)."""
    big = base64.b64encode(encode_png(np.zeros((1, 4096, 4096), dtype=np.uint8))).decode("ascii")
    copies = MAX_REQUEST_BYTES // len(big)
    assert copies >= 300  # the request is under the byte limit
    frame = pd.DataFrame({"image": [big] * copies})
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"declare [\d,]+ pixels in all .* over the limit of 67,108,864"):
        decode_payload(frame, (1, 28, 28))
    assert time.perf_counter() - start < 2.0


def test_the_pixel_budget_counts_both_forms_and_admits_what_fits() -> None:
    small = base64.b64encode(encode_png(np.zeros((1, 28, 28), dtype=np.uint8))).decode("ascii")
    frame = pd.DataFrame({"image": [small, None], "pixels": [None, np.zeros((28, 28), dtype=np.uint8)]})
    assert decode_payload(frame, (1, 28, 28)).shape == (2, 1, 28, 28)
    with pytest.raises(ValueError, match="declare 1,568 pixels in all"):
        decode_payload(frame, (1, 28, 28), max_request_pixels=1000)
    assert MAX_REQUEST_PIXELS >= 4096 * 4096  # one image at the per-image limit always fits


def test_the_input_example_is_encoded_losslessly_without_torch() -> None:
    """register's input example (``image_frame``) is PNG that decodes to the very pixels, grey and colour,
    and encoding it imports neither torch nor torchvision (which pulls in torch._dynamo: seconds)."""
    import io
    import subprocess
    import sys
    from pathlib import Path

    from PIL import Image

    rng = np.random.default_rng(0)
    for shape in ((1, 16, 16), (3, 20, 13)):
        pixels = rng.integers(0, 256, shape, dtype=np.uint8)
        back = np.asarray(Image.open(io.BytesIO(encode_png(pixels))))
        assert np.array_equal(back[None] if back.ndim == 2 else back.transpose(2, 0, 1), pixels)
    probe = ("import sys, numpy as np\nfrom pipeline.registry.payload import image_frame\n"
             "image_frame(np.zeros((2, 3, 8, 8), dtype=np.uint8))\n"
             "print(sorted(m for m in ('torch', 'torchvision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
