#!/usr/bin/env bash
# The main job on the shipped demo model and data (calib_data/): sets up, builds, then runs mpq.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh >/dev/null
mpq=build/apps/mpq/mpq
$mpq inspect calib_data/demo.onnx
