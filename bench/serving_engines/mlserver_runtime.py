# ruff: noqa  -- a measurement prototype, kept as it was run (bench/serving_engines/README.md)
import sys, base64, numpy as np, torch
sys.path.insert(0, __import__("os").environ.get("REPO", "."))
from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput
from mlserver.codecs import StringCodec
from pipeline.serving.onnx_engine import OnnxCascade
from pipeline.routing.recognize import recognize_arrays
from pipeline.data.sources import decode_image_bytes

class Cascade(MLModel):
    async def load(self):
        torch.set_num_threads(1)
        self.o = OnnxCascade(self.settings.parameters.uri)
        return True
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        c, h, w = self.o.image_shape
        data = payload.inputs[0].data.root if hasattr(payload.inputs[0].data, "root") else payload.inputs[0].data
        imgs = np.stack([decode_image_bytes(base64.b64decode(d), c, (h, w), name="image") for d in data])
        rows = self.o.recognize(imgs)
        return InferenceResponse(model_name=self.name, outputs=[
            ResponseOutput(name="class_index", shape=[len(rows)], datatype="INT64", data=[r["class_index"] for r in rows]),
            ResponseOutput(name="exit", shape=[len(rows)], datatype="INT64", data=[r["exit"] for r in rows]),
        ])
