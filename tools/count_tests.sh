#!/usr/bin/env bash
# Prints "<passed> <failed>" summed over every test.xml under a bazel-testlogs directory.
# Works for GoogleTest's XML and for the XML Bazel writes itself when a test binary crashes:
# both have <testsuite ... tests="N" failures="F" errors="E" ...> elements.
set -uo pipefail
dir="${1:-bazel-testlogs}"
total=0
bad=0
skipped=0
while IFS= read -r -d '' xml; do
  while IFS= read -r line; do
    attr() { echo "$line" | grep -o " $1=\"[0-9]*\"" | head -n1 | grep -o '[0-9]*'; }
    t=$(attr tests); f=$(attr failures); e=$(attr errors); d=$(attr disabled); s=$(attr skipped)
    total=$((total + ${t:-0}))
    bad=$((bad + ${f:-0} + ${e:-0}))
    skipped=$((skipped + ${d:-0} + ${s:-0}))
  done < <(grep -o '<testsuite [^>]*>' "$xml")
done < <(find -L "$dir" -name test.xml -print0 2>/dev/null)
echo "$((total - bad - skipped)) ${bad}"
