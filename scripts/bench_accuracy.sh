#!/usr/bin/env bash
# Benchmark (not a test): INT8 PTQ accuracy on Fashion-MNIST, mpq (each calibration method) against
# PyTorch FX PTQ and ONNX Runtime's quantize_static. Needs torch for the PyTorch peer:
#   .venv/bin/pip install -r scripts/requirements-torch.txt --index-url https://download.pytorch.org/whl/cpu
# Arguments go to scripts/bench_accuracy.py.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
scripts/build.sh >/dev/null
exec .venv/bin/python scripts/bench_accuracy.py "$@"
