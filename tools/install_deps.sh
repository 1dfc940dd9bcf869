#!/usr/bin/env bash
# Installs everything Warden needs on a fresh Debian 12 machine. Idempotent and non-interactive:
# packages already present are skipped, so calling it before every build costs ~1 s.
set -euo pipefail

PACKAGES=(
  g++ git ca-certificates
  bazel-bootstrap bazel-platforms bazel-rules-java
  libtorch-dev
  libabsl-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev
  nlohmann-json3-dev
  # SHA-256 of cached kernel libraries (runtime/private_files.cc).
  libssl-dev
  # `warden report`: graphviz draws the graphs as SVG; the HTML report test renders the page in
  # headless Chromium (about 290 MB) and needs a font for its screenshot.
  graphviz
  chromium fonts-dejavu-core
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
