"""The ONNX export's format names, importable without torch (the Triton backend's environment has
ONNX Runtime, NumPy and Pillow only)."""

FORMAT = "cascade-onnx"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
