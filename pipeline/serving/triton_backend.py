"""The cascade as a model of Triton Inference Server's Python backend (``cascade serve --server triton``).

Triton's C++ HTTP front parses the requests and its dynamic batcher gathers them; :meth:`execute`
gets one list of requests per batch, decodes their images with the same code as ``ingest``, runs them
through the ONNX Runtime cascade with its early exits as one batch, and answers each request on its own
(a bad image fails its request with a 400 and a message, never the requests batched with it).

This file runs in Triton's Python stub, in the environment ``scripts/setup_triton.sh`` builds (NumPy,
ONNX Runtime and Pillow; no torch): it imports only torch-free project modules. The settings come from
the model's ``config.pbtxt`` parameters, written by :func:`pipeline.serving.triton.write_repository`;
a request's images are held to the limits of every served path (:mod:`pipeline.serving.limits`: their
count, each one's pixels and the request's, from the headers before decoding), while Triton's front
bounds bodies and its queue.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from pipeline.data.request_images import MAX_REQUEST_PIXELS, Item, RequestError, decode_items
from pipeline.serving.engines import freeze_heap
from pipeline.serving.limits import ServeLimits, check_count
from pipeline.serving.onnx_engine import OnnxCascade

MAGIC = (b"\x89PNG", b"\xff\xd8\xff")  # raw PNG/JPEG bytes (binary tensor extension); otherwise base64 text


def parameters(model_config: dict[str, Any]) -> dict[str, str]:
    """The ``parameters`` of a model config (``{"key": {"string_value": "..."}}``) as plain strings."""
    return {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}


def onnx_path(onnx_dir: str, model_folder: str) -> str:
    """The export's folder: ``onnx_dir`` as given when absolute, else inside the model's folder of the
    repository (Triton passes it as ``model_repository``)."""
    return onnx_dir if os.path.isabs(onnx_dir) else os.path.join(model_folder, onnx_dir)


def image_item(element: bytes, name: str) -> Item:
    """One element of the ``image`` tensor as the request decoder's item: raw PNG/JPEG bytes (binary
    tensor extension), or their base64 text (JSON requests)."""
    return Item(name, "bytes" if element.startswith(MAGIC) else "base64", element)


def request_limits(settings: dict[str, str]) -> ServeLimits:
    """The request limits the model's config carries (a repository written before it held
    ``max_request_pixels`` gets the default)."""
    return ServeLimits(max_images=int(settings["max_images"]), max_pixels=int(settings["max_pixels"]),
                       max_request_pixels=int(settings.get("max_request_pixels", MAX_REQUEST_PIXELS)))


def decode_request(elements: list[bytes], shape: tuple[int, int, int], limits: ServeLimits) -> np.ndarray:
    """A request's images as uint8 ``(n, C, H, W)``, by the one request decoder
    (:func:`pipeline.data.request_images.decode_items`); a ValueError (its RequestError) naming every
    bad image, or the request's budget it is over."""
    if not elements:
        raise RequestError("the request has no image")
    check_count(len(elements), limits)
    names = [f"image {i}" for i in range(len(elements))] if len(elements) > 1 else ["image"]
    return decode_items([image_item(e, n) for e, n in zip(elements, names, strict=True)], shape,
                        max_pixels=limits.max_pixels, max_bytes=limits.max_bytes,
                        max_request_pixels=limits.max_request_pixels)


def answer_arrays(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """The outputs of one request, ``(n, 1)`` each, from the engine's rows."""
    return {"class_index": np.array([[r["class_index"]] for r in rows], dtype=np.int64),
            "class_name": np.array([[r["class_name"].encode()] for r in rows], dtype=np.object_),
            "confidence": np.array([[r["confidence"]] for r in rows], dtype=np.float32),
            "exit": np.array([[r["exit"]] for r in rows], dtype=np.int64),
            "macs": np.array([[r["macs"]] for r in rows], dtype=np.int64)}


class TritonPythonModel:
    """Triton's entry points: ``initialize`` loads the engine once, ``execute`` answers a batch."""

    def initialize(self, args: dict[str, str]) -> None:
        settings = parameters(json.loads(args["model_config"]))
        self.engine = OnnxCascade(onnx_path(settings["onnx_dir"], args.get("model_repository", ".")),
                                  threads=int(settings.get("threads", "1")))
        self.exits = settings.get("exits", "1") == "1"
        self.limits = request_limits(settings)
        freeze_heap()

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils  # exists only inside Triton's stub

        decoded: list[np.ndarray | str] = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "image")
            try:
                decoded.append(decode_request([bytes(e) for e in tensor.as_numpy().reshape(-1)],
                                              self.engine.image_shape, self.limits))
            except ValueError as exc:  # a DataError or a BadRequest: this request's fault alone
                decoded.append(str(exc))
        good = [x for x in decoded if not isinstance(x, str)]
        rows = self.engine.recognize(np.concatenate(good), exits=self.exits) if good else []
        out, start = [], 0
        for x in decoded:
            if isinstance(x, str):
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(x, pb_utils.TritonError.INVALID_ARG)))
                continue
            part, start = rows[start:start + len(x)], start + len(x)
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(name, array) for name, array in answer_arrays(part).items()]))
        return out
