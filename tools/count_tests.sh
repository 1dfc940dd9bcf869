#!/usr/bin/env bash
# Prints "<passed> <failed>" summed over the given test.xml files, or over every test.xml under a
# bazel-testlogs directory when given one directory:
#   bash tools/count_tests.sh bazel-testlogs
#   bash tools/count_tests.sh a/test.xml b/test.xml
# A testlogs directory also holds results of earlier invocations (other targets, --runs_per_test
# runs): .ci/run passes the files its own invocation reported (Bazel's build event file).
# Works for GoogleTest's XML and for the XML Bazel writes itself when a test binary crashes:
# both have <testsuite ... tests="N" failures="F" errors="E" ...> elements.
set -uo pipefail
files=()
if [ "$#" -eq 1 ] && [ -d "$1" ] || [ "$#" -eq 0 ]; then
  while IFS= read -r -d '' xml; do files+=("$xml"); done < <(find -L "${1:-bazel-testlogs}" -name test.xml -print0 2>/dev/null)
else
  files=("$@")
fi
total=0
bad=0
skipped=0
for xml in "${files[@]}"; do
  if [ ! -f "$xml" ]; then total=$((total + 1)); bad=$((bad + 1)); continue; fi  # reported, but missing
  while IFS= read -r line; do
    attr() { echo "$line" | grep -o " $1=\"[0-9]*\"" | head -n1 | grep -o '[0-9]*'; }
    t=$(attr tests); f=$(attr failures); e=$(attr errors); d=$(attr disabled); s=$(attr skipped)
    total=$((total + ${t:-0}))
    bad=$((bad + ${f:-0} + ${e:-0}))
    skipped=$((skipped + ${d:-0} + ${s:-0}))
  done < <(grep -o '<testsuite [^>]*>' "$xml")
done
echo "$((total - bad - skipped)) ${bad}"
