#!/usr/bin/env bash
# Sets up, builds and runs every test. When nvcc is present the tests run with the CUDA backend
# compiled in (the default). GPU tests skip, visibly, on machines without a GPU. Last, the whole
# suite runs once more built with AddressSanitizer and UndefinedBehaviorSanitizer
# (-DMPQ_SANITIZE=ON, CUDA off, so it is also the CUDA-off check; about 20 minutes to build on 2
# cores, 5 to test); MPQ_SKIP_SANITIZE=1 leaves that stage out and builds and tests
# -DMPQ_CUDA=OFF without sanitizers instead.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
export MPQ_PYTHON="$PWD/.venv/bin/python"
jobs=${JOBS:-$(nproc)}

BUILD_DIR=build scripts/build.sh -DMPQ_WERROR=ON
ctest --test-dir build --output-on-failure -j "$jobs"

# The sanitizer stage below is also the CUDA-off configuration (-DMPQ_CUDA=OFF, whole suite), so a
# separate CUDA-off build runs only when that stage is skipped.
cuda_off_check() {
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "== again with -DMPQ_CUDA=OFF =="
    BUILD_DIR=build-nocuda scripts/build.sh -DMPQ_WERROR=ON -DMPQ_CUDA=OFF
    ctest --test-dir build-nocuda --output-on-failure -j "$jobs"
  fi
}

if [ "${MPQ_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== again with AddressSanitizer + UndefinedBehaviorSanitizer (-DMPQ_SANITIZE=ON, CUDA off) =="
  BUILD_DIR=build-asan scripts/build.sh -DMPQ_WERROR=ON -DMPQ_CUDA=OFF -DMPQ_SANITIZE=ON
  # A report ends the process with exit code 86, which no test expects (bad-input tests run mpq
  # and check for 1 or 2), so a report in a child process fails its test too. ASan's reports also
  # go to files, printed below; UBSan writes to stderr.
  san_logs=$(mktemp -d)
  status=0
  ASAN_OPTIONS="detect_leaks=1:exitcode=86:log_path=$san_logs/asan" UBSAN_OPTIONS="print_stacktrace=1:exitcode=86" \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" || status=$?
  if compgen -G "$san_logs/*" >/dev/null; then
    echo "== sanitizer reports =="
    cat "$san_logs"/*
    status=1
  fi
  rm -rf "$san_logs"
  [ "$status" = 0 ] || exit "$status"
else
  echo "== sanitizer stage skipped (MPQ_SKIP_SANITIZE=1) =="
  cuda_off_check
fi
