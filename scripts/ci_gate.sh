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
cd "$(dirname "$0")/.."

mpq=${MPQ:-build/apps/mpq/mpq}
out=${OUT:-build/ci_gate}
threads=${MPQ_THREADS:-1}
while [ $# -gt 0 ]; do
  case "$1" in
    --mpq) mpq=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "ci_gate: unknown argument $1" >&2; exit 2 ;;
  esac
done

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
mkdir -p "$out"

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

# FP16: only when this build's `mpq convert` offers --fp16 (it is being written); otherwise the
# leg is skipped, visibly.
if "$mpq" convert --help 2>/dev/null | grep -q -- '--fp16'; then
  echo "== ci_gate: fp16: mpq convert --fp16"
  if "$mpq" convert --fp16 "$model" -o "$out/demo_fp16.onnx"; then
    validate fp16 "$out/demo_fp16.onnx"
  else
    summary+=("fp16: ERROR (mpq convert failed)")
    status=2
  fi
else
  echo "ci_gate: SKIPPED the FP16 leg: 'mpq convert --help' does not list --fp16 in this build"
  summary+=("fp16: SKIPPED (mpq convert --fp16 not available)")
fi

# Percentile calibration: with the default entropy method the demo's INT8 model loses ~27 points
# of accuracy (the KL search clips the input image at 0.81 of its 2.02 range), which this gate
# rightly rejects; switch back to the default once entropy calibration handles such inputs.
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
