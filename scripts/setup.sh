#!/usr/bin/env bash
# Idempotent set-up of a fresh machine: the Fashion-MNIST and PostgreSQL Debian packages, a virtualenv
# with the project and its dependencies, and DVC with analytics off. Quick when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
DATASET_FILE=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
APT_UPDATED=""
apt_install() {
    if [ -z "$APT_UPDATED" ]; then $SUDO apt-get update -qq; APT_UPDATED=1; fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@"
}

if [ ! -f "$DATASET_FILE" ]; then
    echo "setup: installing the Debian package dataset-fashion-mnist"
    apt_install dataset-fashion-mnist
fi

# PostgreSQL for the team tracking server (scripts/team_server.sh, tests/test_team_server.py). Not
# needed by the pipeline: if it cannot be installed, set-up goes on and that test skips, saying why.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
    echo "setup: installing the Debian package postgresql"
    if ! apt_install postgresql; then
        if [ -n "${CI:-}" ]; then
            echo "setup: error: could not install postgresql, which the tests need in CI" >&2
            exit 1
        fi
        echo "setup: warning: could not install postgresql; the team-server tests will skip" >&2
    fi
fi

# hey, the compiled HTTP load generator bench/serving.py drives the server with. Not needed by the
# pipeline or the tests: if it cannot be installed, set-up goes on and the benchmark says so.
if ! command -v hey >/dev/null 2>&1; then
    echo "setup: installing the Debian package hey"
    apt_install hey || echo "setup: warning: could not install hey; bench/serving.py needs it" >&2
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PYTHON" -m venv .venv
fi

# Reinstall only when the declared dependencies change.
stamp=".venv/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    # PyTorch's x86_64 wheel carries its CUDA libraries: a fresh .venv takes about 7 GB. Say so before pip
    # runs out of room half-way through (pip's own message names neither the need nor the place).
    if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
        free_kb=$(df -Pk .venv | awk 'NR == 2 {print $4}')
        if [ "${free_kb:-0}" -lt $((8 * 1024 * 1024)) ]; then
            echo "setup: error: $((free_kb / 1024)) MB free on the file system of $(pwd)/.venv; installing PyTorch" \
                 "and the project's dependencies there needs about 8 GB (the virtualenv is about 7 GB)" >&2
            exit 1
        fi
    fi
    echo "setup: installing Python dependencies into .venv (first time: a few minutes)"
    .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
    # torch 2.14.1 + torchvision 0.29.1 lie on this machine's disk (the only torchvision that imports
    # here); elsewhere fall back to whatever pyproject's ranges resolve to.
    .venv/bin/pip install -q --disable-pip-version-check "torch==2.14.1" "torchvision==0.29.1" \
        || .venv/bin/pip install -q --disable-pip-version-check torch torchvision
    .venv/bin/pip install -q --disable-pip-version-check -e ".[dev,bench]"
    rm -f .venv/.installed-*
    touch "$stamp"
fi

# Triton Inference Server for `cascade serve --server triton` (scripts/setup_triton.sh, about 150 MB
# under .venv/triton). Not needed by the pipeline: if it cannot be installed, set-up goes on and the
# Triton serving tests skip, saying why (in CI they fail).
if ! bash scripts/setup_triton.sh; then
    if [ -n "${CI:-}" ]; then
        echo "setup: error: could not install Triton Inference Server, which the tests need in CI" >&2
        exit 1
    fi
    echo "setup: warning: could not install Triton Inference Server; cascade serve --server triton needs it" >&2
fi

if [ ! -d .dvc ]; then
    .venv/bin/dvc init -q
fi
.venv/bin/dvc config core.analytics false
echo "setup: ready (.venv, dataset-fashion-mnist, dvc)"
