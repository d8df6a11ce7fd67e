# ruff: noqa  -- a measurement prototype, kept as it was run (bench/serving_engines/README.md)
import sys, base64, numpy as np, torch, litserve as ls
sys.path.insert(0, __import__("os").environ.get("REPO", "."))
from pipeline.serving.onnx_engine import OnnxCascade
from pipeline.routing.recognize import recognize_arrays
from pipeline.data.sources import decode_image_bytes

class API(ls.LitAPI):
    def setup(self, device):
        torch.set_num_threads(1)
        self.o = OnnxCascade(sys.argv[1])
        self.shape = self.o.image_shape
    def decode_request(self, request):
        c, h, w = self.shape
        return decode_image_bytes(base64.b64decode(request["image"]), c, (h, w), name="image")
    def batch(self, xs):
        return np.stack(xs)
    def predict(self, x):
        return self.o.recognize(x)
    def unbatch(self, rows):
        return rows
    def encode_response(self, row):
        return row

if __name__ == "__main__":
    mb = int(sys.argv[3])
    server = ls.LitServer(API(max_batch_size=mb, batch_timeout=float(sys.argv[4]), api_path="/invocations"), accelerator="cpu", workers_per_device=1, fast_queue=len(sys.argv) > 5)
    server.run(port=int(sys.argv[2]), generate_client_file=False, log_level="warning", num_api_servers=int(__import__("os").environ.get("NAPI","1")))
