#!/usr/bin/env bash
# The main job on the shipped demo model and data (calib_data/): sets up, builds, then
#   inspect -> calibrate -> quantize (INT8 QDQ) -> convert (FP16)
#   -> validate both against FP32 on the 1,000 labelled images of calib_data/eval
#   -> 4-bit weights: post-training quantization, then label-free quantization-aware fine-tuning
#      (qat-finetune, the FP32 model as teacher), both validated the same way.
# Outputs go to out/demo/ (MPQ_DEMO_OUT overrides). About a minute on 2 cores once built.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh >/dev/null
mpq=${BUILD_DIR:-build}/apps/mpq/mpq
out=${MPQ_DEMO_OUT:-out/demo}
mkdir -p "$out"
step() { printf '\n== %s\n' "$*"; }

step "inspect the FP32 model"
$mpq inspect calib_data/demo.onnx

step "calibrate on 128 training images (entropy)"
$mpq calibrate calib_data/demo.onnx --data calib_data/calib -o "$out/demo.calib.json" --trt-cache "$out/demo.trt.cache"

step "quantize to INT8 QDQ ONNX"
$mpq quantize calib_data/demo.onnx --calib "$out/demo.calib.json" -o "$out/demo.int8.onnx"

step "convert to FP16 (fragile ops kept in FP32)"
$mpq convert --fp16 calib_data/demo.onnx -o "$out/demo.fp16.onnx"

step "FP32 vs INT8 on 1,000 labelled test images"
$mpq validate --reference calib_data/demo.onnx --candidate "$out/demo.int8.onnx" --data calib_data/eval \
  --thresholds ci/thresholds/demo_int8.json --report "$out/demo.int8.report.html"

step "FP32 vs FP16 on the same images"
$mpq validate --reference calib_data/demo.onnx --candidate "$out/demo.fp16.onnx" --data calib_data/eval \
  --thresholds ci/thresholds/demo_fp16.json --report "$out/demo.fp16.report.html"

step "4-bit weights, post-training (the baseline QAT starts from)"
$mpq quantize calib_data/demo.onnx --calib "$out/demo.calib.json" --weight-bits 4 -o "$out/demo.w4.ptq.onnx"
$mpq validate --reference calib_data/demo.onnx --candidate "$out/demo.w4.ptq.onnx" --data calib_data/eval \
  --report "$out/demo.w4.ptq.report.html" || true

step "4-bit weights, quantization-aware fine-tuning without labels (FP32 model as teacher)"
$mpq qat-finetune calib_data/demo.onnx --data calib_data/calib --calib "$out/demo.calib.json" --weight-bits 4 \
  --epochs 20 --batch-size 32 --lr 1e-4 --eval-data calib_data/eval --checkpoint "$out/qat" -o "$out/demo.w4.qat.onnx"
$mpq validate --reference calib_data/demo.onnx --candidate "$out/demo.w4.qat.onnx" --data calib_data/eval \
  --thresholds ci/thresholds/demo_w4_qat.json --report "$out/demo.w4.qat.report.html"

printf '\nmodels, tables and HTML reports in %s/\n' "$out"
