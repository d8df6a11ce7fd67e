"""Serving the cascade: engines (torch, ONNX Runtime), the ONNX export, request decoding and limits,
and the HTTP server (``cascade serve``)."""
