#!/usr/bin/env bash
# Warden against torch.compile, side by side, on this machine in one run (README "Warden and
# torch.compile"): the same workloads through torch.compile (Dynamo + Inductor, CPU) in Python and
# through Warden in C++, both on the same LibTorch (the torch of PYTHON, default the project's
# virtual environment that tools/install_deps.sh creates), then the Markdown table.
#   bash bench/compare.sh            PYTHON=/path/to/python bash bench/compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
torch_dir="$("$python" -c 'import importlib.util as u; print(u.find_spec("torch").submodule_search_locations[0])')"
out="${TMPDIR:-/tmp}/warden-compare.$$"
mkdir -p "$out"
# Its own output base: switching LibTorch in the default one would rebuild everything there.
bazel --output_base="${WARDEN_TORCH2_OUTPUT_BASE:-$HOME/.cache/bazel-torch2}" run \
  --symlink_prefix=/ --repo_env=WARDEN_LIBTORCH="$torch_dir" //bench:compare_warden > "$out/warden.jsonl"
"$python" bench/torch_compile_compare.py > "$out/torch_compile.jsonl"
echo "LibTorch: torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) ($torch_dir); $(nproc) cores"
"$python" bench/compare_table.py "$out/warden.jsonl" "$out/torch_compile.jsonl"
