#!/usr/bin/env bash
# Benchmark (not a test): mpq vs ONNX Runtime median latency per model and batch size (1 and 8),
# same inputs and threads, with the ratio. Arguments go to scripts/bench_run.py.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
scripts/build.sh >/dev/null
exec .venv/bin/python scripts/bench_run.py "$@"
