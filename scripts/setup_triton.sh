#!/usr/bin/env bash
# Triton Inference Server for `cascade serve --server triton` (pipeline/serving/triton.py), idempotent.
# The server is the tritonserver binary of the nvidia-pytriton wheel (PyPI), unpacked, not installed as a
# package (the wheel pins NumPy < 2; the project's environment has NumPy 2). Its Python backend runs
# the cascade in a small environment of its own (NumPy < 2, ONNX Runtime, Pillow), which the wheel's
# Python stub is built for. Everything goes under .venv/triton (or $CASCADE_TRITON_HOME).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTRITON=nvidia-pytriton==0.7.0
HOME_DIR=${CASCADE_TRITON_HOME:-.venv/triton}
PY=.venv/bin/python
ORT=$($PY -c "import onnxruntime; print(onnxruntime.__version__)")
PIL=$($PY -c "import PIL; print(PIL.__version__)")
stamp="$HOME_DIR/.installed-$(echo "$PYTRITON $ORT $PIL $(cat scripts/setup_triton.sh)" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then exit 0; fi

echo "setup: installing Triton Inference Server ($PYTRITON's tritonserver) into $HOME_DIR"
rm -rf "$HOME_DIR"
mkdir -p "$HOME_DIR/wheel"
$PY -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: "$PYTRITON" -d "$HOME_DIR/wheel"
$PY -m zipfile -e "$HOME_DIR"/wheel/nvidia_pytriton-*.whl "$HOME_DIR/unpacked"
server="$HOME_DIR/server"
mkdir -p "$server/backends/python"
mv "$HOME_DIR/unpacked/pytriton/tritonserver/bin" "$server/bin"
mv "$HOME_DIR/unpacked/nvidia_pytriton.libs" "$server/libs"
backend="$HOME_DIR/unpacked/pytriton/tritonserver/backends/python"
cp "$backend/libtriton_python.so" "$backend/triton_python_backend_utils.py" "$server/backends/python/"
version=$($PY -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
cp "$HOME_DIR/unpacked/pytriton/tritonserver/python_backend_stubs/$version/triton_python_backend_stub" \
    "$server/backends/python/"
chmod +x "$server/bin/tritonserver" "$server/backends/python/triton_python_backend_stub"
rm -rf "$HOME_DIR/unpacked" "$HOME_DIR/wheel"

$PY -m venv "$HOME_DIR/env"
"$HOME_DIR/env/bin/pip" install -q --disable-pip-version-check "numpy<2" "onnxruntime==$ORT" "pillow==$PIL"
touch "$stamp"
echo "setup: Triton Inference Server ready in $HOME_DIR"
