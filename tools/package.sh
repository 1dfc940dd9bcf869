#!/usr/bin/env bash
# Builds Warden's CMake package (README "Use Warden from your project"):
#   PREFIX/lib/libwarden.so
#   PREFIX/include/warden/runtime/warden.h (and the headers it includes)
#   PREFIX/lib/cmake/Warden/WardenConfig.cmake   find_package(Warden) -> Warden::warden
# against the LibTorch the build finds (WARDEN_LIBTORCH, the python3 on PATH, or Debian's; pass
# --repo_env=WARDEN_LIBTORCH=DIR among the Bazel flags to choose).
#   bash tools/package.sh PREFIX [bazel build flags...]
#   BAZEL="bazel --output_base=DIR" bash tools/package.sh ...   (another output base)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "usage: tools/package.sh PREFIX [bazel build flags...]" >&2
  exit 2
fi
prefix="$1"; shift
read -r -a bazel <<< "${BAZEL:-bazel}"

"${bazel[@]}" build "$@" //:libwarden.so
bin="$("${bazel[@]}" info "$@" bazel-bin)"
info="$("${bazel[@]}" info "$@" output_base)/external/warden_libtorch/info.txt"
value() { sed -n "s/^$1=//p" "$info"; }
torch_version="$(value version)"
torch_root="$(value root)"
torch_lib="$(value lib)"
cmake_dir=""
for d in "$torch_root/share/cmake/Torch" "$torch_lib/cmake/Torch"; do
  if [ -f "$d/TorchConfig.cmake" ]; then cmake_dir="$d"; break; fi
done
if [ -z "$cmake_dir" ]; then
  echo "package.sh: LibTorch $torch_version at $torch_root has no TorchConfig.cmake" >&2
  exit 1
fi

mkdir -p "$prefix/lib/cmake/Warden" "$prefix/include/warden"
prefix="$(cd "$prefix" && pwd)"
install -m 0755 "$bin/libwarden.so" "$prefix/lib/libwarden.so"

# The public header and every project header it includes, at the same relative paths, so
# `#include "runtime/warden.h"` works as it does in Bazel.
declare -A seen=()
queue=("runtime/warden.h")
while [ ${#queue[@]} -gt 0 ]; do
  h="${queue[0]}"; queue=("${queue[@]:1}")
  [ -n "${seen[$h]:-}" ] && continue
  seen[$h]=1
  install -D -m 0644 "$h" "$prefix/include/warden/$h"
  while IFS= read -r inc; do
    [ -f "$inc" ] && queue+=("$inc")
  done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$h")
done

sub() {
  sed -e "s|@TORCH_VERSION@|$torch_version|g" -e "s|@TORCH_CMAKE_DIR@|$cmake_dir|g" \
      -e "s|@WARDEN_VERSION@|0.1.0|g" "$1"
}
sub tools/cmake/WardenConfig.cmake.in > "$prefix/lib/cmake/Warden/WardenConfig.cmake"
sub tools/cmake/WardenConfigVersion.cmake.in > "$prefix/lib/cmake/Warden/WardenConfigVersion.cmake"
echo "package.sh: Warden for LibTorch $torch_version ($cmake_dir) in $prefix"
