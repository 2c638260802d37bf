#!/usr/bin/env bash
# Configure and build mpq. Extra arguments go to CMake (e.g. -DMPQ_CUDA=OFF).
# BUILD_DIR picks the folder (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
if [ ! -f "$build_dir/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
fi
ninja -C "$build_dir" ${NINJA_FLAGS:-}
