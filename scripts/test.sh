#!/usr/bin/env bash
# Sets up, builds and runs every test. When nvcc is present the tests run twice: with the CUDA
# backend compiled in (the default) and with -DMPQ_CUDA=OFF. GPU tests skip, visibly, on
# machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
export MPQ_PYTHON="$PWD/.venv/bin/python"
jobs=${JOBS:-$(nproc)}

BUILD_DIR=build scripts/build.sh -DMPQ_WERROR=ON
ctest --test-dir build --output-on-failure -j "$jobs"

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "== again with -DMPQ_CUDA=OFF =="
  BUILD_DIR=build-nocuda scripts/build.sh -DMPQ_WERROR=ON -DMPQ_CUDA=OFF
  ctest --test-dir build-nocuda --output-on-failure -j "$jobs"
fi
