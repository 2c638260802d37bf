#!/usr/bin/env bash
# Benchmark (not a test): calibration peak memory and time, mpq vs ONNX Runtime's calibrators.
# Arguments go to scripts/bench_calibrate.py.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
scripts/build.sh >/dev/null
exec .venv/bin/python scripts/bench_calibrate.py "$@"
