#!/usr/bin/env bash
# Installs everything Warden needs on a fresh Debian 12 machine. Idempotent and non-interactive:
# packages already present are skipped, so calling it before every build costs ~1 s.
#
# Two LibTorch versions (README "Which LibTorch"): Debian's libtorch-dev (1.13.1; the default
# build) and PyTorch 2.13's CPU wheel in the virtual environment .venv/ of the checkout
# (`bazel test --repo_env=WARDEN_LIBTORCH=$PWD/.venv //...`; torch.compile for bench/compare.sh).
#   WARDEN_TORCH_WHEEL=0 bash tools/install_deps.sh   skips the wheel
set -euo pipefail

PACKAGES=(
  g++ git ca-certificates
  bazel-bootstrap bazel-platforms bazel-rules-java
  libtorch-dev
  libabsl-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev
  nlohmann-json3-dev
  # A real BLAS for LibTorch 1.13: Debian's libtorch links libblas.so.3/liblapack.so.3, which the
  # alternatives system points at the highest-priority implementation installed; OpenBLAS (100)
  # outranks the netlib reference BLAS (10), so eager's matmul is what a Debian user has. Tests
  # run it single-threaded (.bazelrc: OPENBLAS_NUM_THREADS=1), benchmarks pin it to their
  # intra-op thread count (bench/reporting.h).
  libopenblas0-pthread
  # The CMake package (tools/package.sh) and its example host (examples/cmake_host).
  cmake make
  # SHA-256 of cached kernel libraries (runtime/private_files.cc) and HMAC-SHA256 of shared entries.
  libssl-dev
  # The shared kernel cache (runtime/remote_cache.cc): the Redis client, and the server its tests
  # and benchmark start on a loopback port.
  libhiredis-dev redis-server
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

if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "install_deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# PyTorch 2.13 (CPU wheel; pip takes it from a local file on the project's machines) in .venv/.
TORCH_VERSION=2.13.0
if [ "${WARDEN_TORCH_WHEEL:-1}" != "0" ]; then
  root="$(cd "$(dirname "$0")/.." && pwd)"
  venv="$root/.venv"
  have="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
  if [ "${have%%+*}" != "$TORCH_VERSION" ]; then
    echo "install_deps: installing torch==$TORCH_VERSION into $venv" >&2
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q "torch==$TORCH_VERSION"
  fi
fi
