# ruff: noqa  -- a measurement prototype, kept as it was run (bench/serving_engines/README.md)
# PyTriton 0.7.0: Triton 2.51's C++ HTTP front and dynamic batcher; one batch per call into Python.
# Request (KServe v2 JSON): {"inputs":[{"name":"image","shape":[1,1],"datatype":"BYTES","data":["<base64 PNG>"]}]}
import sys, os, base64, numpy as np
sys.path.insert(0, os.environ.get("REPO", "."))
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor, DynamicBatcher
from pytriton.triton import Triton, TritonConfig
from pipeline.serving.onnx_engine import OnnxCascade
from pipeline.data.sources import decode_image_bytes

onnx = OnnxCascade(sys.argv[1])
C, H, W = onnx.image_shape

@batch
def infer(image):
    x = np.stack([decode_image_bytes(base64.b64decode(row[0]), C, (H, W), name="image") for row in image])
    rows = onnx.recognize(x)
    return {"class_index": np.array([[r["class_index"]] for r in rows], dtype=np.int64),
            "exit": np.array([[r["exit"]] for r in rows], dtype=np.int64)}

if __name__ == "__main__":
    port, mb, delay_us = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    cfg = TritonConfig(http_port=port, grpc_port=port + 1, metrics_port=port + 2, log_verbose=0)
    with Triton(config=cfg) as t:
        t.bind(model_name="cascade", infer_func=infer,
               inputs=[Tensor(name="image", dtype=bytes, shape=(1,))],
               outputs=[Tensor(name="class_index", dtype=np.int64, shape=(1,)), Tensor(name="exit", dtype=np.int64, shape=(1,))],
               config=ModelConfig(max_batch_size=mb, batcher=DynamicBatcher(max_queue_delay_microseconds=delay_us)))
        print("serving", flush=True)
        t.serve()
