#!/usr/bin/env bash
# Packs everything a GPU machine without a package manager needs to test mpq's CUDA backend into
# one folder (at most 48 MiB; the test binaries and libraries in payload.tar.xz when they would not fit): the mpq binary and its CUDA plugin, the CUDA test and benchmark
# binaries, every shared library they load that is not part of the CUDA toolkit (cudart, cuBLAS,
# cuDNN, NCCL, the driver) or glibc (found with ldd), a small model with its data, and
# scripts/gpu_check.sh, which runs the lot there and writes one results file.
#
# Then it proves the folder is self-contained: with `env -i` and only the folder's lib/ on
# LD_LIBRARY_PATH, every non-toolkit dependency must resolve inside the folder (ldd), and the
# tests that need no GPU must pass (the GPU ones must report SKIPPED).
#
#   scripts/gpu_bundle.sh [--build-dir build] [--out DIR] [--no-build]
# Default out: <build-dir>/gpu_bundle/mpq-gpu (a tarball mpq-gpu.tar.gz is written beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
build_dir=build
out=
do_build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    *) echo "gpu_bundle.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$build_dir" in /*) ;; *) build_dir=$src/$build_dir ;; esac
out=${out:-$build_dir/gpu_bundle/mpq-gpu}
limit=$((48 * 1024 * 1024))

# Host-run (no GPU needed) and GPU tests of the CUDA backend.
host_tests=(kernel_bodies_test quant_bodies_test train_bodies_test backward_runner_test node_runner_test graph_runner_test cuda_executor_test cuda_conformance_test lib_descriptors_test cuda_plan_test
            cuda_node_plan_test cuda_allocator_test)
gpu_tests=(gpu_kernels_test gpu_node_runner_test gpu_backward_runner_test gpu_autograd_test gpu_graph_runner_test gpu_executor_test gpu_conformance_test)
# The models the graph runner tests load (tests/cuda/model_cases.h), found through $MPQ_TEST_MODELS.
runner_models=(resnet_bn_op13 resnet_bn_op17 mobilenetv3_op13 transformer_op13 unet_op13 tiny_bert)
# And the ones gpu_autograd_test adds (test::load_test_model looks in $MPQ_TEST_MODELS first).
autograd_models=(mobilenetv3_op17 transformer_op17)
tests=("${host_tests[@]}" "${gpu_tests[@]}")
benches=(bench_cuda_kernels bench_cuda_gemm)

if [ "$do_build" = 1 ]; then
  BUILD_DIR=$build_dir NINJA_FLAGS="${NINJA_FLAGS:-}" scripts/build.sh >/dev/null
  ninja -C "$build_dir" mpq mpq_cuda "${tests[@]}" "${benches[@]}" ${NINJA_FLAGS:-}
fi
[ -f "$build_dir/apps/mpq/libmpq_cuda.so" ] || { echo "gpu_bundle.sh: no CUDA plugin in $build_dir (configured with MPQ_CUDA=OFF?)" >&2; exit 2; }

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data"
cp "$build_dir/apps/mpq/mpq" "$build_dir/apps/mpq/libmpq_cuda.so" "$out/bin/"
for t in "${tests[@]}" "${benches[@]}"; do
  f=$(find "$build_dir/tests" -maxdepth 1 -name "$t" -type f | head -1)
  [ -n "$f" ] || { echo "gpu_bundle.sh: $t was not built" >&2; exit 2; }
  cp "$f" "$out/bin/"
done
# Symbols are not needed to run the tests; stripping keeps the folder under the size limit.
strip --strip-unneeded "$out"/bin/* 2>/dev/null || true
cp "$src/scripts/gpu_check.sh" "$out/"
cp -r "$src/tests/models/resnet_bn_op13.onnx" "$src/tests/models/resnet_bn_op13_data" "$out/data/"
mkdir -p "$out/data/models"
for m in "${runner_models[@]}" "${autograd_models[@]}"; do cp "$src/tests/models/$m.onnx" "$out/data/models/"; done
# The conformance tests' data (ONNX's backend test cases, $MPQ_TESTDATA) and known failures
# ($MPQ_SOURCE_DIR/tests/runtime); the test data goes into payload.tar.xz (39 MB, 6 MB packed).
testdata=$(sed -n 's/^MPQ_TESTDATA_DIR:PATH=//p' "$build_dir/CMakeCache.txt")
testdata=${testdata:-/usr/share/libonnx-testdata/data}
[ -d "$testdata/node" ] || { echo "gpu_bundle.sh: ONNX test data not found at $testdata (libonnx-testdata)" >&2; exit 2; }
mkdir -p "$out/data/onnx-testdata" "$out/data/src/tests/runtime"
for suite in node pytorch-converted pytorch-operator simple; do cp -r "$testdata/$suite" "$out/data/onnx-testdata/"; done
cp "$src"/tests/runtime/conformance_known_failures*.txt "$out/data/src/tests/runtime/"
# The models scripts/gpu_bench.py times and validates, made here by this build's mpq on the CPU:
# FP16 (mpq convert), INT8 QDQ (mpq quantize --mode static, where the model ships calibration
# data) and the demo's 4-bit fake-quant student for the QAT step (mpq quantize --format fakequant).
mpq_bin=$build_dir/apps/mpq/mpq
bench=$out/data/bench
mkdir -p "$bench"
for m in resnet_bn mobilenetv3 unet transformer; do
  "$mpq_bin" convert --fp16 "$src/tests/models/${m}_op13.onnx" -o "$bench/${m}_fp16.onnx" >/dev/null
  "$mpq_bin" quantize "$src/tests/models/${m}_op13.onnx" --data "$src/tests/models/${m}_op13_data" --mode static \
    -o "$bench/${m}_int8.onnx" >/dev/null
done
"$mpq_bin" calibrate "$src/calib_data/demo.onnx" --data "$src/calib_data/calib" -o "$bench/demo.calib.json" >/dev/null
"$mpq_bin" quantize "$src/calib_data/demo.onnx" --calib "$bench/demo.calib.json" -o "$bench/fashion_demo_int8.onnx" >/dev/null
"$mpq_bin" convert --fp16 "$src/calib_data/demo.onnx" -o "$bench/fashion_demo_fp16.onnx" >/dev/null
"$mpq_bin" quantize "$src/calib_data/demo.onnx" --calib "$bench/demo.calib.json" --weight-bits 4 --format fakequant \
  -o "$bench/fashion_demo_fq.onnx" >/dev/null
cp "$src/scripts/gpu_bench.py" "$out/"

# Toolkit and driver libraries come from the GPU machine; glibc and the loader too.
is_system() {
  case "$(basename "$1")" in
    libcuda.so*|libcudart*|libcublas*|libcudnn*|libnccl*|libnvrtc*|libnvJitLink*|libcufft*|libcurand*|libcusparse*|libcusolver*|libnvidia-*) return 0 ;;
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libresolv.so*|libutil.so*|linux-vdso*) return 0 ;;
  esac
  return 1
}
missing=0
for f in "$out"/bin/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      is_system "$name" || { echo "gpu_bundle.sh: $(basename "$f") needs $name, which is not found" >&2; missing=1; }
      continue
    fi
    is_system "$path" && continue
    [ -f "$out/lib/$(basename "$path")" ] || cp -L "$path" "$out/lib/"
  done < <(ldd "$f")
done
[ "$missing" = 0 ] || exit 1
strip --strip-unneeded "$out"/lib/* 2>/dev/null || true

# Manifest: what was built from where, the newest glibc symbol needed, and every file.
{
  echo "mpq GPU bundle"
  echo "commit: $(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$src" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm)"
  echo "nvcc: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1 || echo unknown)"
  echo "needs glibc >= $(objdump -T "$out"/bin/* "$out"/lib/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
  echo "needs from the GPU machine: NVIDIA driver for CUDA 13, CUDA 13 runtime libraries (cudart, cuBLASLt), cuDNN 9"
  echo "files:"
  (cd "$out" && find . -type f ! -name MANIFEST.txt | sort | xargs sha256sum)
} > "$out/MANIFEST.txt"

size=$(du -sb "$out" | cut -f1)
if [ "$size" -gt "$limit" ]; then
  # Too big as plain files (OpenBLAS alone is ~36 MB): the test binaries and lib/ go into one
  # xz archive, which gpu_check.sh unpacks in place before it runs anything. -9 (about 90 s on
  # 2 cores) keeps 30 MB where -6 needed 36, which no longer fit beside the plain files.
  (cd "$out" && tar -cf - lib data/onnx-testdata $(printf 'bin/%s ' "${tests[@]}" "${benches[@]}") | xz -T2 -9 > payload.tar.xz &&
    rm -rf lib data/onnx-testdata && (cd bin && rm -f "${tests[@]}" "${benches[@]}"))
  size=$(du -sb "$out" | cut -f1)
fi
echo "bundle: $out ($((size / 1024)) KiB, limit $((limit / 1024)) KiB)"
[ "$size" -le "$limit" ] || { echo "gpu_bundle.sh: bundle exceeds 48 MiB" >&2; exit 1; }
tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"

# ---- the self-containment check: nothing from this machine's library paths but toolkit/glibc
echo "== env -i check =="
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$out" "$work/b"
b=$work/b
[ -f "$b/payload.tar.xz" ] && tar -C "$b" -xJf "$b/payload.tar.xz"
fail=0
for f in "$b"/bin/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_system "$name" && continue
    case "$path" in
      "$b"/lib/*) ;;
      *) echo "FAIL: $(basename "$f") loads $name from $path, outside the bundle"; fail=1 ;;
    esac
  done < <(env -i LD_LIBRARY_PATH="$b/lib" ldd "$f")
done
run() {  # run NAME EXPECT_RC CMD...
  local name=$1 expect=$2
  shift 2
  local rc=0
  (cd "$work" && env -i LD_LIBRARY_PATH="$b/lib" HOME="$work" MPQ_TEST_MODELS="$b/data/models" MPQ_TESTDATA="$b/data/onnx-testdata" \
     MPQ_SOURCE_DIR="$b/data/src" "$@") >"$work/$name.log" 2>&1 || rc=$?
  if [ "$rc" = "$expect" ]; then
    echo "ok: $name"
  else
    echo "FAIL: $name exited $rc (expected $expect)"
    tail -20 "$work/$name.log"
    fail=1
  fi
}
run mpq_version 0 "$b/bin/mpq" --version
run mpq_devices 0 "$b/bin/mpq" devices
run mpq_run_cpu 0 "$b/bin/mpq" run "$b/data/resnet_bn_op13.onnx" --data "$b/data/resnet_bn_op13_data" --device cpu --outputs "$work/outs"
for t in "${host_tests[@]}"; do
  run "$t" 0 "$b/bin/$t" --use-colour no
done
# Without a GPU the GPU tests must say so (a visible skip), not pass silently or fail.
for t in "${gpu_tests[@]}"; do
  run "$t" 0 "$b/bin/$t" --use-colour no
  if ! grep -q "SKIPPED: no usable CUDA device" "$work/$t.log" && ! grep -q "All tests passed" "$work/$t.log"; then
    echo "FAIL: $t neither ran nor reported its skip"; fail=1
  fi
done
[ "$fail" = 0 ] && echo "env -i check passed" || { echo "env -i check FAILED"; exit 1; }
