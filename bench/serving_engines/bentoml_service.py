# ruff: noqa  -- a measurement prototype, kept as it was run (bench/serving_engines/README.md)
import sys, os, base64, numpy as np
sys.path.insert(0, __import__("os").environ.get("REPO", "."))
import bentoml
from pipeline.serving.onnx_engine import OnnxCascade
from pipeline.data.sources import decode_image_bytes

WORKERS = int(os.environ.get("WORKERS", "1"))

@bentoml.service(workers=WORKERS, traffic={"timeout": 30})
class Cascade:
    def __init__(self):
        self.o = OnnxCascade(__import__("os").environ["ONNX_MODEL"])
        self.shape = self.o.image_shape

    @bentoml.api(batchable=True, max_batch_size=64, max_latency_ms=100, route="/invocations")
    def invocations(self, images: list[str]) -> list[dict]:
        c, h, w = self.shape
        x = np.stack([decode_image_bytes(base64.b64decode(s), c, (h, w), name="image") for s in images])
        return self.o.recognize(x)
