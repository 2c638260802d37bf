#!/usr/bin/env bash
# FP16 conversion benchmark: `mpq convert --fp16` side by side with onnxconverter-common's
# convert_float_to_float16 (keep_io_types=True) on tests/models, the Fashion-MNIST classifiers
# (all 10,000 test images) and, with --testdata, every ONNX backend test model ONNX Runtime loads.
# Results: a Markdown table on stdout (pasted into docs/fp16.md) and raw JSON in $OUT/bench_fp16.json.
#
# Usage: scripts/bench_fp16.sh [BUILD_DIR] [--testdata]
#   BUILD_DIR   where mpq was built (default: build); the binary is BUILD_DIR/apps/mpq/mpq
#   PYTHON      interpreter with onnxruntime, onnx, onnxconverter-common (default: .venv, then /opt/mpq-venv)
#   OUT         folder for converted models (default: /tmp/mpq_bench_fp16)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="${1:-$root/build}"
shift || true
mpq="$build/apps/mpq/mpq"
[[ -x "$mpq" ]] || { echo "bench_fp16: no mpq binary at $mpq (build first)" >&2; exit 2; }
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  for p in "$root/.venv/bin/python" /opt/mpq-venv/bin/python; do [[ -x "$p" ]] && { python="$p"; break; }; done
fi
[[ -n "$python" ]] || { echo "bench_fp16: no Python with onnxruntime (set PYTHON)" >&2; exit 2; }
out="${OUT:-/tmp/mpq_bench_fp16}"
mkdir -p "$out"
extra=()
if [[ "${1:-}" == "--testdata" ]]; then extra=(--testdata /usr/share/libonnx-testdata/data); fi
exec "$python" "$here/bench_fp16.py" --mpq "$mpq" --out "$out" --json "$out/bench_fp16.json" "${extra[@]}"
