#!/usr/bin/env bash
# `warden report` in a browser: renders the HTML of testdata/report_trace.jsonl in headless
# Chromium, checks the DOM for the report's headings and Graphviz's SVG graphs, and that a
# screenshot is a non-trivial PNG. tools/install_deps.sh installs chromium and graphviz; without
# them this test fails and says so.
set -euo pipefail

warden="$1"
trace="$2"

browser="$(command -v chromium || command -v chromium-browser || true)"
if [ -z "$browser" ]; then
  echo "FAIL: chromium is not installed; run tools/install_deps.sh (it installs chromium and graphviz)"
  exit 1
fi
if ! command -v dot >/dev/null; then
  echo "FAIL: Graphviz's dot is not installed; run tools/install_deps.sh"
  exit 1
fi

out="${TEST_TMPDIR}/report.html"
"$warden" report "$trace" --out="$out"
test -s "$out"

export HOME="${TEST_TMPDIR}"  # Chromium writes its profile under HOME
flags=(--headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run
       --user-data-dir="${TEST_TMPDIR}/chromium-profile")

dom="${TEST_TMPDIR}/dom.html"
timeout 60 "$browser" "${flags[@]}" --dump-dom "file://${out}" > "$dom" 2>/dev/null
for heading in "<h1>Warden report</h1>" "<h3>Suggestions</h3>" "<h3>Timeline</h3>" "<h3>Recompiles</h3>" \
               "<h3>Cache entries</h3>" "function 'scaled' (id 0, pid 4242)" \
               "arg0.size(0) changed 2 times (4, 5): mark_dynamic(0, 0)"; do
  if ! grep -qF "$heading" "$dom"; then
    echo "FAIL: the rendered DOM has no '$heading'"
    exit 1
  fi
done
# Every entry's graph is drawn by dot (the report falls back to text, without <svg>, when it fails).
svgs="$(grep -o '<svg' "$dom" | wc -l)"
if [ "$svgs" -lt 1 ]; then
  echo "FAIL: the rendered DOM has no Graphviz <svg> graph"
  exit 1
fi

png="${TEST_TMPDIR}/report.png"
timeout 60 "$browser" "${flags[@]}" --window-size=1200,1600 --screenshot="$png" "file://${out}" >/dev/null 2>&1
if [ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" != "89504e470d0a1a0a" ]; then
  echo "FAIL: $png is not a PNG"
  exit 1
fi
size="$(stat -c %s "$png")"
# A blank 1200x1600 page compresses to a few KB; the report's text, tables and timeline do not.
if [ "$size" -lt 30000 ]; then
  echo "FAIL: screenshot is only $size bytes: the page rendered (nearly) empty"
  exit 1
fi
echo "PASS: rendered in $browser, DOM has the headings and $svgs SVG graphs, screenshot $size bytes"
