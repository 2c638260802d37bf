#!/usr/bin/env bash
# Configure and build mpq. Extra arguments go to CMake (e.g. -DMPQ_CUDA=OFF).
# BUILD_DIR picks the folder (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
launcher=()
if command -v ccache >/dev/null 2>&1; then
  # Optional: several build folders (CUDA on/off, sanitizers, helpers' trees) share one cache.
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
if [ ! -f "$build_dir/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
fi
ninja -C "$build_dir" ${NINJA_FLAGS:-}
