#!/usr/bin/env bash
# `warden package` end to end: the demo compiles its kernels into one cache; the package built from
# it serves the demo on a host with no compiler on PATH (0 compiler runs, no fallback to "aten");
# a package read with another key serves nothing (its entries are rejected, and the demo still
# runs: replayed, said so in the trace).
#   package_demo_test.sh WARDEN_CLI DEMO
set -euo pipefail
warden="$1"
demo="$2"
t="$(mktemp -d "${TEST_TMPDIR:-/tmp}/package_demo.XXXXXX")"
trap 'rm -rf "$t"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

head -c 32 /dev/urandom | base64 > "$t/key"
chmod 600 "$t/key"
WARDEN_CACHE_DIR="$t/build" WARDEN_TRACE_DIR="$t/buildtrace" "$demo" > "$t/build.txt" 2>&1 \
  || fail "demo (build host): $(tail -20 "$t/build.txt")"
# Another run into the same cache (other kernels): a package of the traced run leaves them out.
WARDEN_CACHE_DIR="$t/build" "$demo" --d=32 --calls=20 > "$t/other.txt" 2>&1 || fail "demo --d=32: $(tail -5 "$t/other.txt")"
WARDEN_CACHE_KEY_FILE="$t/key" "$warden" package --cache="$t/build/kernels" --out="$t/all.wpkg" > "$t/all.txt" \
  || fail "warden package (all): $(cat "$t/all.txt")"
grep -q ": 4 kernel libraries" "$t/all.txt" || fail "expected the whole cache (4 libraries): $(cat "$t/all.txt")"
WARDEN_CACHE_KEY_FILE="$t/key" "$warden" package --cache="$t/build/kernels" --trace="$t/buildtrace" \
  --out="$t/demo.wpkg" > "$t/pkg.txt" || fail "warden package --trace: $(cat "$t/pkg.txt")"
grep -q ": 2 kernel libraries" "$t/pkg.txt" || fail "expected the traced run's 2 libraries: $(cat "$t/pkg.txt")"
grep -q "HMAC-SHA256 tagged" "$t/pkg.txt" || fail "package not tagged: $(cat "$t/pkg.txt")"
[ "$(stat -c %a "$t/demo.wpkg")" = 600 ] || fail "package is not private"

# The "robot": no compiler anywhere on PATH, its own empty kernel cache.
env PATH=/nonexistent WARDEN_CXX= WARDEN_CACHE_DIR="$t/robot" WARDEN_PACKAGE="$t/demo.wpkg" \
  WARDEN_CACHE_KEY_FILE="$t/key" WARDEN_TRACE_DIR="$t/trace" "$demo" > "$t/robot.txt" 2>&1 \
  || fail "demo (no compiler): $(tail -20 "$t/robot.txt")"
grep -q "0 eager calls" "$t/robot.txt" || fail "demo ran eagerly: $(tail -5 "$t/robot.txt")"
log="$(ls "$t"/trace/*.jsonl)"
hits=$(grep -o '"package_hits":[0-9]*' "$log" | awk -F: '{s += $2} END {print s + 0}')
runs=$(grep -o '"compiler_runs":[0-9]*' "$log" | awk -F: '{s += $2} END {print s + 0}')
[ "$hits" -ge 1 ] || fail "no kernel came from the package"
[ "$runs" -eq 0 ] || fail "$runs compiler runs on the host without a compiler"
if grep -q '"event":"backend_fallback"' "$log"; then fail "a kernel fell back to aten: $(grep backend_fallback "$log")"; fi
echo "no compiler: $hits kernel libraries from the package, $runs compiler runs"

# Another fleet's key: nothing from the package is loaded; the demo still runs correctly (replay).
head -c 32 /dev/urandom | base64 > "$t/other"
chmod 600 "$t/other"
env PATH=/nonexistent WARDEN_CXX= WARDEN_CACHE_DIR="$t/robot2" WARDEN_PACKAGE="$t/demo.wpkg" \
  WARDEN_CACHE_KEY_FILE="$t/other" WARDEN_TRACE_DIR="$t/trace2" "$demo" > "$t/robot2.txt" 2>&1 \
  || fail "demo (wrong key): $(tail -20 "$t/robot2.txt")"
grep -q "package entry rejected (tag: does not verify" "$t/robot2.txt" || fail "no rejection reported"
log2="$(ls "$t"/trace2/*.jsonl)"
hits2=$(grep -o '"package_hits":[0-9]*' "$log2" | awk -F: '{s += $2} END {print s + 0}')
[ "$hits2" -eq 0 ] || fail "a package entry tagged with another key was loaded"
grep -q '"event":"backend_fallback"' "$log2" || fail "no fallback reported"
echo "PASS"
