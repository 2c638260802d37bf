#!/usr/bin/env bash
# Benchmark (not a test): calibration peak memory and time, mpq vs ONNX Runtime's calibrators.
# Arguments go to scripts/bench_calibrate.py. BUILD_DIR picks the build folder (default: build);
# MPQ_PYTHON an interpreter with onnxruntime (default: the .venv that scripts/setup.sh makes).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
if [ -z "${MPQ_PYTHON:-}" ]; then
  scripts/setup.sh --python
  MPQ_PYTHON=.venv/bin/python
fi
BUILD_DIR=$build_dir NINJA_FLAGS="${NINJA_FLAGS:-} mpq" scripts/build.sh >/dev/null
exec "$MPQ_PYTHON" scripts/bench_calibrate.py --mpq "$build_dir/apps/mpq/mpq" "$@"
