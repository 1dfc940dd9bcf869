// The HTML rendering of `warden report`: one self-contained page (inline CSS and SVG, no script,
// no external resources), the same content as TextReport plus an SVG timeline strip per function
// and Graphviz SVG graphs where `dot` is installed.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tools/report_lib.h"

namespace warden::report {
namespace {

std::string Esc(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string DotEsc(absl::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// Every "%name" in `s`.
std::vector<std::string> ValueRefs(absl::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') continue;
    size_t j = i + 1;
    while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_' || s[j] == '.')) ++j;
    if (j > i + 1) out.emplace_back(s.substr(i, j - i));
    i = j - 1;
  }
  return out;
}

bool Executable(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// dot -Tsvg on `source`; "" on any failure (the caller shows text instead).
std::string RenderSvg(const std::string& dot, const std::string& source) {
  char dir_template[] = "/tmp/warden-report-XXXXXX";
  const char* dir = ::mkdtemp(dir_template);
  if (dir == nullptr) return "";
  const std::string in = absl::StrCat(dir, "/g.dot"), out = absl::StrCat(dir, "/g.svg");
  { std::ofstream(in) << source; }
  const std::string cmd = absl::StrCat("'", dot, "' -Tsvg '", in, "' -o '", out, "' 2>/dev/null");
  std::string svg;
  if (std::system(cmd.c_str()) == 0) svg = ReadFile(out);
  std::remove(in.c_str());
  std::remove(out.c_str());
  ::rmdir(dir);
  const size_t start = svg.find("<svg");
  return start == std::string::npos ? "" : svg.substr(start);
}

const char* KindColor(const std::string& kind) {
  static const std::map<std::string, const char*> kColors = {
      {"compile", "#2e7d32"},      {"recompile", "#ef6c00"}, {"cache limit", "#c62828"},
      {"eager fallback", "#c62828"}, {"trace error", "#6a1b9a"}, {"backend error", "#6a1b9a"},
      {"hits", "#b0bec5"},         {"eager", "#ef9a9a"},     {"unknown", "#eeeeee"}};
  auto it = kColors.find(kind);
  return it == kColors.end() ? "#999" : it->second;
}

// One strip: x = call index; runs of hits as bars, compiles and misses as ticks.
std::string TimelineSvg(const std::vector<TimelineRow>& rows) {
  int64_t calls = 1;
  for (const TimelineRow& r : rows) calls = std::max(calls, r.last_call + 1);
  const double width = 960, left = 10, plot = width - 2 * left;
  auto x = [&](int64_t call) { return left + plot * static_cast<double>(call) / static_cast<double>(calls); };
  std::string svg = absl::StrFormat(
      "<svg class=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"58\" "
      "viewBox=\"0 0 %.0f 58\" role=\"img\" aria-label=\"timeline of calls\">",
      width, width);
  absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%.1f\" y1=\"24\" x2=\"%.1f\" y2=\"24\" stroke=\"#ccc\"/>", left,
                                        left + plot));
  for (const TimelineRow& r : rows) {
    const bool run = r.kind == "hits" || r.kind == "eager" || r.kind == "unknown";
    const std::string title = absl::StrCat(r.first_call == r.last_call ? absl::StrCat("call ", r.first_call)
                                                                       : absl::StrCat("calls ", r.first_call, "-", r.last_call),
                                           ": ", r.kind, r.entry.empty() ? "" : absl::StrCat(" ", r.entry), " ", r.text);
    if (run) {
      absl::StrAppend(&svg, absl::StrFormat("<rect x=\"%.1f\" y=\"18\" width=\"%.1f\" height=\"12\" fill=\"%s\">"
                                            "<title>%s</title></rect>",
                                            x(r.first_call), std::max(1.0, x(r.last_call + 1) - x(r.first_call)),
                                            KindColor(r.kind), Esc(title)));
    } else {
      absl::StrAppend(&svg, absl::StrFormat("<rect x=\"%.1f\" y=\"8\" width=\"%.1f\" height=\"32\" fill=\"%s\">"
                                            "<title>%s</title></rect>",
                                            x(r.first_call), std::max(3.0, x(r.first_call + 1) - x(r.first_call)),
                                            KindColor(r.kind), Esc(title)));
    }
  }
  for (int64_t tick : {int64_t{0}, calls / 2, calls - 1}) {
    absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.1f\" y=\"54\" font-size=\"11\" fill=\"#555\">call %d</text>",
                                          std::min(x(tick), width - 60), tick));
  }
  absl::StrAppend(&svg, "</svg>");
  return svg;
}

constexpr const char* kStyle = R"css(
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1100px;
       color: #222; line-height: 1.4; }
h1 { font-size: 26px; margin-bottom: 4px; }
h2 { font-size: 20px; border-bottom: 2px solid #ddd; padding-bottom: 4px; margin-top: 36px; }
h3 { font-size: 16px; margin: 22px 0 8px; }
h4 { font-size: 14px; margin: 14px 0 6px; }
pre, code { font-family: "DejaVu Sans Mono", Menlo, monospace; font-size: 12px; }
pre { background: #f6f8fa; padding: 8px 10px; overflow-x: auto; border-radius: 4px; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
.kind { color: white; border-radius: 3px; padding: 0 6px; white-space: nowrap; }
.muted { color: #666; }
.failed { color: #b71c1c; }
.suggestion { background: #fff8e1; border-left: 4px solid #ffb300; padding: 6px 10px; margin: 6px 0; }
.graph svg { max-width: 100%; height: auto; }
details { margin: 6px 0; }
summary { cursor: pointer; }
)css";

}  // namespace

std::string FindDot() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/dot");
    if (Executable(candidate)) return candidate;
  }
  return "";
}

std::string GraphDot(const std::string& graph_text) {
  std::string out = "digraph G {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n";
  std::map<std::string, std::string> producer;  // value -> node id
  int next = 0;
  for (absl::string_view raw : absl::StrSplit(graph_text, '\n', absl::SkipWhitespace())) {
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (absl::ConsumePrefix(&line, "graph(")) {
      for (absl::string_view param : absl::StrSplit(absl::StripSuffix(line, "):"), "%", absl::SkipEmpty())) {
        const std::string text = std::string(absl::StripSuffix(absl::StripAsciiWhitespace(param), ","));
        const std::string name = absl::StrCat("%", text.substr(0, text.find(':')));
        const std::string id = absl::StrCat("n", next++);
        producer[name] = id;
        absl::StrAppend(&out, "  ", id, " [label=\"", DotEsc(absl::StrCat("%", text)),
                        "\", shape=ellipse, style=filled, fillcolor=\"#e3f2fd\"];\n");
      }
      continue;
    }
    if (absl::ConsumePrefix(&line, "return")) {
      const std::string id = absl::StrCat("n", next++);
      absl::StrAppend(&out, "  ", id, " [label=\"return\", shape=ellipse, style=filled, fillcolor=\"#e8f5e9\"];\n");
      for (const std::string& ref : ValueRefs(line)) {
        if (producer.count(ref)) absl::StrAppend(&out, "  ", producer[ref], " -> ", id, ";\n");
      }
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == absl::string_view::npos) continue;
    const absl::string_view lhs = line.substr(0, eq), rhs = line.substr(eq + 3);
    const std::string id = absl::StrCat("n", next++);
    const size_t paren = rhs.find('(');
    const size_t colon = rhs.rfind(") : ");
    const absl::string_view op = rhs.substr(0, paren == absl::string_view::npos ? rhs.size() : paren);
    const absl::string_view type = colon == absl::string_view::npos ? rhs.substr(op.size()) : rhs.substr(colon + 4);
    absl::StrAppend(&out, "  ", id, " [label=\"", DotEsc(absl::StrCat(lhs, " = ", op, "\n", type)), "\"",
                    absl::StartsWith(op, "constant") ? ", style=filled, fillcolor=\"#f3e5f5\"" : "", "];\n");
    if (paren != absl::string_view::npos) {
      const absl::string_view inputs =
          rhs.substr(paren + 1, colon == absl::string_view::npos ? absl::string_view::npos : colon - paren - 1);
      for (const std::string& ref : ValueRefs(inputs)) {
        if (producer.count(ref)) absl::StrAppend(&out, "  ", producer[ref], " -> ", id, ";\n");
      }
    }
    for (const std::string& ref : ValueRefs(lhs)) producer[ref] = id;
  }
  absl::StrAppend(&out, "}\n");
  return out;
}

std::string HtmlReport(const Trace& trace, const std::string& dot) {
  std::string out = absl::StrCat("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
                                 "<title>Warden report</title><style>", kStyle, "</style></head><body>\n");
  absl::StrAppend(&out, "<h1>Warden report</h1>\n<p class=\"muted\">", trace.num_events, " events in ",
                  Esc(absl::StrJoin(trace.files, ", ")), "; graphs ",
                  dot.empty() ? "as text (Graphviz <code>dot</code> not installed)" : "rendered by Graphviz",
                  "</p>\n");
  for (const std::string& n : trace.notes) absl::StrAppend(&out, "<p class=\"failed\">", Esc(n), "</p>\n");

  absl::StrAppend(&out, "<table><tr><th>function</th><th>summary</th><th>suggestions</th></tr>\n");
  for (size_t i = 0; i < trace.functions.size(); ++i) {
    const FunctionTrace& f = trace.functions[i];
    absl::StrAppend(&out, "<tr><td><a href=\"#f", i, "\">", Esc(FunctionTitle(f)), "</a></td><td>",
                    Esc(absl::StrJoin(FunctionSummary(f), "; ")), "</td><td>", Suggestions(f).size(), "</td></tr>\n");
  }
  absl::StrAppend(&out, "</table>\n");

  for (size_t i = 0; i < trace.functions.size(); ++i) {
    const FunctionTrace& f = trace.functions[i];
    absl::StrAppend(&out, "<h2 id=\"f", i, "\">", Esc(FunctionTitle(f)), "</h2>\n");
    for (const std::string& line : FunctionSummary(f)) absl::StrAppend(&out, "<div>", Esc(line), "</div>\n");

    const std::vector<std::string> suggestions = Suggestions(f);
    absl::StrAppend(&out, "<h3>Suggestions</h3>\n");
    for (const std::string& s : suggestions) absl::StrAppend(&out, "<div class=\"suggestion\">", Esc(s), "</div>\n");
    if (suggestions.empty()) absl::StrAppend(&out, "<p class=\"muted\">None: every recompile was expected.</p>\n");

    const std::vector<TimelineRow> rows = Timeline(f);
    absl::StrAppend(&out, "<h3>Timeline</h3>\n", TimelineSvg(rows), "\n");
    absl::StrAppend(&out, "<table><tr><th>calls</th><th>what</th><th>entry</th><th>time</th><th>details</th>"
                          "<th>arguments</th></tr>\n");
    for (const TimelineRow& r : rows) {
      absl::StrAppend(&out, "<tr><td>", r.first_call == r.last_call ? absl::StrCat(r.first_call)
                                                                    : absl::StrCat(r.first_call, "&ndash;", r.last_call),
                      "</td><td><span class=\"kind\" style=\"background:", KindColor(r.kind), "\">", Esc(r.kind),
                      "</span></td><td>", Esc(r.entry), "</td><td>", r.ms >= 0 ? FormatMs(r.ms) : "", "</td><td>",
                      Esc(r.text), "</td><td><code>", Esc(r.args), "</code></td></tr>\n");
    }
    absl::StrAppend(&out, "</table>\n");

    absl::StrAppend(&out, "<h3>Recompiles</h3>\n");
    if (f.misses.empty()) absl::StrAppend(&out, "<p class=\"muted\">No recompiles.</p>\n");
    for (const auto& m : f.misses) {
      absl::StrAppend(&out, "<h4>call ", Int(m, "call"), ": ", Esc(Str(m, "action")),
                      Str(m, "entry").empty() ? "" : absl::StrCat(" &rarr; entry ", Esc(Str(m, "entry"))), "</h4>\n<ul>");
      for (const auto& r : m.value("reasons", nlohmann::json::array())) {
        absl::StrAppend(&out, "<li><code>", Esc(Str(r, "entry")), "</code>: ", Esc(Str(r, "reason")), "</li>");
      }
      absl::StrAppend(&out, "</ul>\n");
      const nlohmann::json closest = m.value("closest", nlohmann::json::object());
      if (!closest.contains("entry")) continue;
      const nlohmann::json failing = closest.value("failing", nlohmann::json::array());
      absl::StrAppend(&out, "<div>Closest entry <code>", Esc(Str(closest, "entry")), "</code>: ", failing.size(), " of ",
                      Int(closest, "num_guards"), " guards failed</div>\n<table><tr><th>guard</th><th>required by</th>"
                      "<th>this call</th></tr>");
      for (const auto& g : failing) {
        absl::StrAppend(&out, "<tr><td><code>", Esc(Str(g, "text")), "</code></td><td>", Esc(Str(g, "provenance")),
                        "</td><td class=\"failed\">", Esc(Str(g, "reason")), "</td></tr>");
      }
      absl::StrAppend(&out, "</table>\n");
      const nlohmann::json compiled = EntryCompile(f, Str(closest, "entry"));
      if (!compiled.is_null()) {
        const auto diff = ArgDiff(compiled.value("args", nlohmann::json::array()), m.value("args", nlohmann::json::array()));
        absl::StrAppend(&out, "<table><tr><th>argument</th><th>entry ", Esc(Str(closest, "entry")),
                        " was compiled for</th><th>this call</th></tr>");
        for (const ArgChange& d : diff) {
          absl::StrAppend(&out, "<tr><td>", Esc(d.name), "</td><td><code>", Esc(d.before), "</code></td><td><code>",
                          Esc(d.after), "</code></td></tr>");
        }
        if (diff.empty()) absl::StrAppend(&out, "<tr><td colspan=\"3\">no visible difference</td></tr>");
        absl::StrAppend(&out, "</table>\n");
      }
    }

    absl::StrAppend(&out, "<h3>Cache entries</h3>\n");
    for (const auto& c : f.compiles) {
      const std::string entry = Str(c, "entry");
      const int64_t hits = EntryHits(f, entry);
      const nlohmann::json ms = c.value("ms", nlohmann::json::object());
      absl::StrAppend(&out, "<h4>entry ", Esc(entry), "</h4>\n<div>created at call ", Int(c, "call"), " (",
                      Esc(Str(c, "action")), "), backend ", Esc(Str(c, "backend")), ", hits ",
                      hits >= 0 ? absl::StrCat(hits) : "unknown", "; compile ", FormatMs(ms.value("total", 0.0)),
                      " (trace ", FormatMs(ms.value("trace", 0.0)), ", guards ", FormatMs(ms.value("guards", 0.0)),
                      ", backend ", FormatMs(ms.value("backend", 0.0)), ")</div>\n<div>compiled for <code>",
                      Esc(ArgsShort(c.value("args", nlohmann::json::array()))), "</code></div>\n");
      if (!Str(c, "backend_note").empty()) absl::StrAppend(&out, "<div>note: ", Esc(Str(c, "backend_note")), "</div>\n");
      const std::string symbols = SymbolsText(c);
      if (!symbols.empty()) absl::StrAppend(&out, "<div>symbols: <code>", Esc(symbols), "</code></div>\n");
      const std::string graph = Str(c, "graph");
      const std::string svg = dot.empty() ? "" : RenderSvg(dot, GraphDot(graph));
      absl::StrAppend(&out, "<details open><summary>graph (", Int(c, "num_nodes"), " nodes)</summary>");
      if (!svg.empty()) absl::StrAppend(&out, "<div class=\"graph\">", svg, "</div><details><summary>as text</summary>");
      absl::StrAppend(&out, "<pre>", Esc(graph), "</pre>", svg.empty() ? "" : "</details>", "</details>\n");
      const nlohmann::json guards = c.value("guards", nlohmann::json::array());
      absl::StrAppend(&out, "<details open><summary>guards (", guards.size(), ")</summary><table><tr><th>guard</th>"
                            "<th>required by</th></tr>");
      for (const auto& g : guards) {
        absl::StrAppend(&out, "<tr><td><code>", Esc(Str(g, "text")), "</code></td><td>", Esc(Str(g, "provenance")),
                        "</td></tr>");
      }
      absl::StrAppend(&out, "</table></details>\n");
    }
  }
  absl::StrAppend(&out, "</body></html>\n");
  return out;
}

}  // namespace warden::report
