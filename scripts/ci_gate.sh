#!/usr/bin/env bash
# The accuracy regression gate mpq runs on its own demo model, and the one users copy:
#   FP32 demo model --convert--> FP16 --mpq validate--> ci/thresholds/demo_fp16.json
#   FP32 demo model --quantize-> INT8 --mpq validate--> ci/thresholds/demo_int8.json
# on the labelled evaluation set calib_data/eval. Exit 0 when every gate holds, 1 when a threshold
# fails (each failing check is printed), 2 on bad input or a failed conversion.
#
#   scripts/ci_gate.sh [--mpq PATH] [--out DIR]
#
# MPQ (default build/apps/mpq/mpq), OUT (default build/ci_gate) and MPQ_THREADS (default 1: the
# gate runs beside other tests; the demo needs a few seconds on one core) can also come from the
# environment. Reports land in OUT: <leg>.json, <leg>.xml (JUnit, for the CI's test view) and
# <leg>.html.
set -uo pipefail

mpq=${MPQ:-}
out=${OUT:-}
threads=${MPQ_THREADS:-1}
while [ $# -gt 0 ]; do
  case "$1" in
    --mpq) [ $# -ge 2 ] || { echo "ci_gate: --mpq needs a path" >&2; exit 2; }; mpq=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || { echo "ci_gate: --out needs a folder" >&2; exit 2; }; out=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "ci_gate: unknown argument $1" >&2; exit 2 ;;
  esac
done
# Paths given relative to the caller's folder stay valid after moving to the repository root
# (a bare command name such as `mpq` is looked up on PATH).
case $mpq in /*|"") ;; */*) mpq="$PWD/$mpq" ;; *) mpq=$(command -v "$mpq") || { echo "ci_gate: $mpq not found on PATH" >&2; exit 2; } ;; esac
case $out in /*|"") ;; *) out="$PWD/$out" ;; esac
cd "$(dirname "$0")/.." || exit 2
mpq=${mpq:-build/apps/mpq/mpq}
out=${out:-build/ci_gate}

model=calib_data/demo.onnx
calib=calib_data/calib
eval_data=calib_data/eval
for p in "$mpq" "$model" "$calib" "$eval_data/images.npy" "$eval_data/labels.npy" \
         ci/thresholds/demo_fp16.json ci/thresholds/demo_int8.json; do
  if [ ! -e "$p" ]; then
    echo "ci_gate: missing $p" >&2
    exit 2
  fi
done
mkdir -p "$out" || exit 2
# Nothing from an earlier run may pass for this run's result.
rm -f "$out"/demo_fp16.onnx "$out"/demo_int8.onnx "$out"/fp16.{json,xml,html} "$out"/int8.{json,xml,html}

status=0
summary=()

# validate LEG CANDIDATE: runs the gate for one candidate; remembers the worst exit code.
validate() {
  local leg=$1 cand=$2 rc=0
  echo "== ci_gate: $leg: mpq validate against ci/thresholds/demo_$leg.json"
  "$mpq" validate --reference "$model" --candidate "$cand" --data "$eval_data" \
      --thresholds "ci/thresholds/demo_$leg.json" --per-layer --top 5 --threads "$threads" \
      --report "$out/$leg.json" --report "$out/$leg.xml" --report "$out/$leg.html" || rc=$?
  case $rc in
    0) summary+=("$leg: PASSED") ;;
    1) summary+=("$leg: FAILED (thresholds)"); [ $status -eq 0 ] && status=1 ;;
    *) summary+=("$leg: ERROR (exit $rc)"); status=2 ;;
  esac
}

echo "== ci_gate: fp16: mpq convert --fp16"
if "$mpq" convert --fp16 "$model" -o "$out/demo_fp16.onnx"; then
  validate fp16 "$out/demo_fp16.onnx"
else
  summary+=("fp16: ERROR (mpq convert failed)")
  status=2
fi

# The calibration method is pinned (as a user's gate should pin it): percentile gives this model
# 32 dB output SNR; the default, entropy, gives 28 dB and also passes these thresholds.
echo "== ci_gate: int8: mpq quantize --method percentile"
if "$mpq" quantize "$model" --data "$calib" --method percentile --threads "$threads" -o "$out/demo_int8.onnx"; then
  validate int8 "$out/demo_int8.onnx"
else
  summary+=("int8: ERROR (mpq quantize failed)")
  status=2
fi

echo "== ci_gate summary (reports in $out)"
for s in "${summary[@]}"; do echo "  $s"; done
exit $status
