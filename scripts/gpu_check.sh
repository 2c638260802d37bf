#!/usr/bin/env bash
# Runs inside a bundle made by scripts/gpu_bundle.sh, on a GPU machine that has the NVIDIA driver
# and the CUDA 13 toolkit but perhaps no package manager: finds cuDNN (toolkit, system, or a
# Python environment's site-packages/nvidia/cudnn/lib), runs every CUDA test (the GPU ones for
# real), compute-sanitizer memcheck and racecheck on the GPU tests, and the GPU benchmark, and
# writes everything to one results file. Exit status 0 only when every step passed.
#
#   ./gpu_check.sh [--results FILE] [--quick] [--repo DIR] [--sanitize-budget SECONDS] [--bench-args "..."]
# --quick skips the sanitizers (they take minutes). --repo: a checkout of the repository (its
# models, calib_data/ and scripts/onnx_torch.py), which turns on scripts/gpu_bench.py (GEMM
# throughput, model latency, QAT step and validate figures against PyTorch / ONNX Runtime on this
# GPU; its JSON goes beside the results file). --sanitize-budget: the sanitizers run last, memcheck
# on every GPU test first, then racecheck, then initcheck, each step stopped when the budget is
# spent; a step not run or stopped is reported and counts as a failure. Test cases tagged [fd]
# (finite-difference gradient checks: many forwards of what other cases run) are left out there.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
results="$here/gpu_results_$(hostname 2>/dev/null || echo host)_$(date -u +%Y%m%dT%H%M%SZ).txt"
quick=0
repo=
sanitize_budget=0
bench_args=
while [ $# -gt 0 ]; do
  case "$1" in
    --results) results=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --repo) repo=$(cd "$2" && pwd); shift 2 ;;
    --sanitize-budget) sanitize_budget=$2; shift 2 ;;
    --bench-args) bench_args=$2; shift 2 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
# gpu_bundle.sh packs lib/ and the test binaries into payload.tar.xz when they would not fit in 48 MiB.
[ -f "$here/payload.tar.xz" ] && [ ! -d "$here/lib" ] && tar -C "$here" -xJf "$here/payload.tar.xz"

log() { echo "$*" | tee -a "$results"; }
: > "$results"
log "== mpq gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm)"
head -3 "$here/MANIFEST.txt" 2>/dev/null | tee -a "$results"

# ---- locate the toolkit, cuDNN and compute-sanitizer
cuda_home=${CUDA_HOME:-}
if [ -z "$cuda_home" ]; then
  for d in /usr/local/cuda /usr/local/cuda-13* /opt/cuda; do [ -d "$d/lib64" ] && { cuda_home=$d; break; }; done
fi
libpath="$here/lib"
[ -n "$cuda_home" ] && libpath="$libpath:$cuda_home/lib64:$cuda_home/targets/x86_64-linux/lib"
has_cudnn() { ls "$1"/libcudnn.so* >/dev/null 2>&1; }
cudnn_dir=
for d in "${CUDNN_LIB:-}" "$cuda_home/lib64" /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/lib; do
  [ -n "$d" ] && has_cudnn "$d" && { cudnn_dir=$d; break; }
done
if [ -z "$cudnn_dir" ]; then
  # pip's nvidia-cudnn-cu13 / -cu12 wheels: .../site-packages/nvidia/cudnn/lib
  for py in python3 python; do
    command -v "$py" >/dev/null 2>&1 || continue
    d=$("$py" -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null) || true
    [ -n "$d" ] && has_cudnn "$d" && { cudnn_dir=$d; break; }
  done
fi
if [ -z "$cudnn_dir" ]; then
  d=$(find / -xdev -path '*site-packages/nvidia/cudnn/lib/libcudnn.so*' 2>/dev/null | head -1)
  [ -n "$d" ] && cudnn_dir=$(dirname "$d")
fi
if [ -n "$cudnn_dir" ]; then
  libpath="$libpath:$cudnn_dir"
  # Wheels ship cuBLAS beside cuDNN (site-packages/nvidia/cublas/lib).
  [ -d "$cudnn_dir/../../cublas/lib" ] && libpath="$libpath:$(cd "$cudnn_dir/../../cublas/lib" && pwd)"
fi
export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MPQ_TEST_MODELS="$here/data/models"  # the graph runner tests' models
export MPQ_TESTDATA="$here/data/onnx-testdata"  # ONNX backend test cases (conformance tests)
export MPQ_SOURCE_DIR="$here/data/src"  # the conformance tests' known-failure lists
sanitizer=$(command -v compute-sanitizer 2>/dev/null || true)
for c in "$cuda_home/bin/compute-sanitizer" "$cuda_home/compute-sanitizer/compute-sanitizer"; do
  [ -z "$sanitizer" ] && [ -x "$c" ] && sanitizer=$c
done
log "CUDA toolkit: ${cuda_home:-not found}; cuDNN: ${cudnn_dir:-NOT FOUND}; compute-sanitizer: ${sanitizer:-NOT FOUND}"
log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 || echo "nvidia-smi unavailable") | tee -a "$results"

failures=0
step() {  # step NAME CMD...: runs, appends its output, records pass/fail
  local name=$1
  shift
  log ""
  log "== $name: $*"
  local start=$SECONDS
  "$@" >>"$results" 2>&1
  local rc=$?
  if [ $rc = 0 ]; then log "-- $name: PASS ($((SECONDS - start)) s)"; else log "-- $name: FAIL (exit $rc, $((SECONDS - start)) s)"; failures=$((failures + 1)); fi
}

cd "$here"
step "mpq devices" bin/mpq devices
for f in bin/*_test; do
  step "$(basename "$f")" timeout 300 "$f" --use-colour no
done
if grep -q "SKIPPED: no usable CUDA device" "$results"; then
  log "NOTE: GPU tests were SKIPPED (see above): this machine's GPU is not usable from this bundle"
  failures=$((failures + 1))
fi
step "bench_cuda_kernels" bin/bench_cuda_kernels --repeat 20
step "mpq run (CPU reference timing)" bin/mpq run data/resnet_bn_op13.onnx --data data/resnet_bn_op13_data --device cpu --outputs "$(mktemp -d)"
step "mpq run --device cuda" bin/mpq run data/resnet_bn_op13.onnx --data data/resnet_bn_op13_data --device cuda --outputs "$(mktemp -d)"
if [ -n "$repo" ]; then
  # Its own table goes to the terminal too (the results file keeps everything).
  # shellcheck disable=SC2086
  step "gpu_bench.py" python3 "$here/gpu_bench.py" --bundle "$here" --repo "$repo" --json "${results%.txt}_bench.json" $bench_args
  sed -n '/^== summary/,$p' "$results" | tail -60
  # ONNX Runtime agreement through the CUDA path on this GPU (the ctests models_agree_with_ort_cuda_path
  # and int8_models_agree_with_ort_cuda_path run it with the host kernel table).
  step "ORT agreement, FP32 models, --device cuda" python3 "$repo/scripts/check_models_vs_ort.py" --mpq "$here/bin/mpq" \
    --device cuda --images-npy "$repo/calib_data/eval/images.npy"
  step "ORT agreement, INT8 QDQ models, --device cuda" python3 "$repo/scripts/check_models_vs_ort.py" --mpq "$here/bin/mpq" \
    --int8 --device cuda --images-npy "$repo/calib_data/eval/images.npy"
fi
if [ "$quick" = 0 ]; then
  if [ -n "$sanitizer" ]; then
    deadline=$((SECONDS + sanitize_budget))
    for tool in memcheck racecheck initcheck; do
      for f in bin/gpu_*_test; do
        t=$(basename "$f")
        extra=()
        [ "$tool" = memcheck ] && extra=(--leak-check full)
        if [ "$sanitize_budget" -gt 0 ]; then
          left=$((deadline - SECONDS))
          if [ "$left" -le 5 ]; then log "-- $tool $t: NOT RUN (sanitizer budget spent)"; failures=$((failures + 1)); continue; fi
          step "$tool $t" timeout "$left" "$sanitizer" --tool "$tool" --error-exitcode 1 ${extra[@]+"${extra[@]}"} "$f" "~[fd]" --use-colour no
        else
          step "$tool $t" "$sanitizer" --tool "$tool" --error-exitcode 1 ${extra[@]+"${extra[@]}"} "$f" "~[fd]" --use-colour no
        fi
      done
    done
  else
    log "compute-sanitizer not found: memcheck/racecheck NOT RUN"
    failures=$((failures + 1))
  fi
fi
log ""
log "== summary: $failures failing step(s); results in $results"
[ "$failures" = 0 ]
