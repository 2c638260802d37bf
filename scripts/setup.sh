#!/usr/bin/env bash
# Installs every Debian package mpq's build, tests and demo need. Non-interactive, idempotent,
# and silent when everything is already present. With --python it also creates the virtualenv
# .venv with the pinned test/benchmark tools from scripts/requirements.txt (no torch).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  cmake ninja-build g++ pkg-config
  libonnx-dev libprotobuf-dev protobuf-compiler
  libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev catch2
  libopenblas-dev libstb-dev libdnnl-dev
  libonnx-testdata dataset-fashion-mnist
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "${1:-}" = "--python" ]; then
  if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv" >&2
    python3 -m venv .venv
  fi
  stamp=.venv/.requirements.sha
  want=$(sha256sum scripts/requirements.txt | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing scripts/requirements.txt into .venv" >&2
    .venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements.txt
    echo "$want" > "$stamp"
  fi
fi
