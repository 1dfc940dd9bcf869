// Loading the trace, timelines, suggestions, the text report and `warden explain`. The HTML
// rendering is in report_html.cc.
#include "tools/report_lib.h"

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"

namespace warden::report {

std::string Str(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

int64_t Int(const nlohmann::json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : fallback;
}

namespace {

const char* ShortDtype(const std::string& dtype) {
  static const std::map<std::string, const char*> kShort = {
      {"Float", "f32"}, {"Double", "f64"}, {"Half", "f16"}, {"BFloat16", "bf16"}, {"Long", "i64"},
      {"Int", "i32"}, {"Short", "i16"}, {"Char", "i8"}, {"Byte", "u8"}, {"Bool", "b8"}};
  auto it = kShort.find(dtype);
  return it == kShort.end() ? nullptr : it->second;
}

std::string ScalarText(const nlohmann::json& v) {
  if (v.is_number_float()) {
    return absl::StrFormat("%g", v.get<double>());
  }
  return v.dump();
}

std::string ArgValue(const nlohmann::json& arg) {
  const std::string type = Str(arg, "type");
  if (type == "Tensor") {
    const std::string dtype = Str(arg, "dtype");
    const char* s = ShortDtype(dtype);
    std::vector<std::string> sizes;
    for (const auto& d : arg.value("sizes", nlohmann::json::array())) sizes.push_back(d.dump());
    std::string out = absl::StrCat(s ? s : dtype, "[", absl::StrJoin(sizes, ", "), "]");
    const std::string device = Str(arg, "device");
    if (!device.empty() && device != "cpu") absl::StrAppend(&out, " ", device);
    if (arg.value("requires_grad", false)) absl::StrAppend(&out, " requires_grad");
    return out;
  }
  if (arg.contains("value")) return absl::StrCat(type, " ", ScalarText(arg["value"]));
  return type;
}

std::string Strides(const nlohmann::json& arg) {
  std::vector<std::string> s;
  for (const auto& d : arg.value("strides", nlohmann::json::array())) s.push_back(d.dump());
  return absl::StrCat("strides [", absl::StrJoin(s, ", "), "]");
}

bool ConsecutiveCalls(const std::vector<int64_t>& calls) {
  for (size_t i = 1; i < calls.size(); ++i) {
    if (calls[i] != calls[i - 1] + 1) return false;
  }
  return calls.size() >= 2;
}

std::string JoinValues(const std::vector<std::string>& values) {
  std::vector<std::string> distinct;
  for (const std::string& v : values) {
    if (std::find(distinct.begin(), distinct.end(), v) == distinct.end()) distinct.push_back(v);
  }
  if (distinct.size() > 8) {
    distinct.resize(8);
    distinct.push_back("...");
  }
  return absl::StrJoin(distinct, ", ");
}

std::string Times(size_t n) { return n == 1 ? "1 time" : absl::StrCat(n, " times"); }

}  // namespace

// --- Loading ------------------------------------------------------------------------------------

Trace ParseTrace(const std::vector<std::pair<std::string, std::string>>& files) {
  Trace trace;
  std::map<std::pair<int64_t, int>, FunctionTrace> functions;
  for (const auto& [name, text] : files) {
    trace.files.push_back(name);
    int line_no = 0;
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
      ++line_no;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        trace.notes.push_back(absl::StrCat(name, ":", line_no, ": not a JSON object (skipped)"));
        continue;
      }
      ++trace.num_events;
      const std::string event = Str(j, "event");
      if (event == "truncated") {
        trace.notes.push_back(absl::StrCat(name, ": truncated after ", Int(j, "bytes"), " bytes (cap ",
                                           Int(j, "max_bytes"), "): later events are missing"));
        continue;
      }
      if (!j.contains("fn_id")) continue;
      FunctionTrace& f = functions[{Int(j, "pid", 0), static_cast<int>(Int(j, "fn_id", 0))}];
      f.pid = Int(j, "pid", 0);
      f.fn_id = static_cast<int>(Int(j, "fn_id", 0));
      if (f.name.empty()) f.name = Str(j, "fn");
      if (event == "function") f.options = j;
      if (event == "compile_end") f.compiles.push_back(j);
      if (event == "recompile" || event == "cache_limit" || event == "eager_fallback") f.misses.push_back(j);
      if (event == "function_end") f.end = j;
      f.events.push_back(std::move(j));
    }
  }
  auto by_call = [](const nlohmann::json& a, const nlohmann::json& b) { return Int(a, "call") < Int(b, "call"); };
  for (auto& [key, f] : functions) {
    std::stable_sort(f.compiles.begin(), f.compiles.end(), by_call);
    std::stable_sort(f.misses.begin(), f.misses.end(), by_call);
    trace.functions.push_back(std::move(f));
  }
  return trace;
}

absl::StatusOr<Trace> LoadTrace(const std::string& path) {
  std::vector<std::string> paths;
  if (DIR* dir = ::opendir(path.c_str())) {
    while (dirent* d = ::readdir(dir)) {
      const std::string name = d->d_name;
      if (absl::EndsWith(name, ".jsonl")) paths.push_back(name);
    }
    ::closedir(dir);
    std::sort(paths.begin(), paths.end());
    if (paths.empty()) return absl::NotFoundError(absl::StrCat(path, ": no *.jsonl trace files (set WARDEN_TRACE_DIR=", path, " when running the program)"));
    for (std::string& p : paths) p = absl::StrCat(path, "/", p);
  } else {
    paths.push_back(path);
  }
  std::vector<std::pair<std::string, std::string>> files;
  for (const std::string& p : paths) {
    std::ifstream in(p);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", p));
    std::stringstream text;
    text << in.rdbuf();
    const size_t slash = p.rfind('/');
    files.emplace_back(slash == std::string::npos ? p : p.substr(slash + 1), text.str());
  }
  return ParseTrace(files);
}

absl::StatusOr<std::set<std::string>> KernelKeysUsed(const std::string& path) {
  auto trace = LoadTrace(path);
  if (!trace.ok()) return trace.status();
  std::set<std::string> keys;
  for (const FunctionTrace& f : trace->functions) {
    for (const nlohmann::json& e : f.events) {
      if (Str(e, "event") != "disk_cache") continue;
      std::string library = Str(e, "kernel_library");
      const size_t slash = library.rfind('/');
      if (slash != std::string::npos) library = library.substr(slash + 1);
      if (library.size() == 35 && absl::EndsWith(library, ".so")) keys.insert(library.substr(0, 32));
    }
  }
  return keys;
}

// --- Building blocks ----------------------------------------------------------------------------

std::string ArgShort(const nlohmann::json& arg) { return absl::StrCat(Str(arg, "name"), ": ", ArgValue(arg)); }

std::string ArgsShort(const nlohmann::json& args) {
  std::vector<std::string> parts;
  if (args.is_array()) {
    for (const auto& a : args) parts.push_back(ArgShort(a));
  }
  return absl::StrJoin(parts, ", ");
}

std::vector<ArgChange> ArgDiff(const nlohmann::json& before, const nlohmann::json& after) {
  std::vector<ArgChange> out;
  if (!before.is_array() || !after.is_array()) return out;
  const size_t n = std::max(before.size(), after.size());
  for (size_t i = 0; i < n; ++i) {
    const std::string name = i < after.size() ? Str(after[i], "name") : Str(before[i], "name");
    const std::string b = i < before.size() ? ArgValue(before[i]) : "(absent)";
    const std::string a = i < after.size() ? ArgValue(after[i]) : "(absent)";
    if (a != b) {
      out.push_back({name, b, a});
    } else if (i < before.size() && i < after.size() && before[i].value("strides", nlohmann::json()) !=
                                                              after[i].value("strides", nlohmann::json())) {
      out.push_back({name, absl::StrCat(b, " ", Strides(before[i])), absl::StrCat(a, " ", Strides(after[i]))});
    }
  }
  return out;
}

nlohmann::json EntryCompile(const FunctionTrace& f, const std::string& entry) {
  for (const auto& c : f.compiles) {
    if (Str(c, "entry") == entry) return c;
  }
  return nullptr;
}

int64_t EntryHits(const FunctionTrace& f, const std::string& entry) {
  if (f.end.is_null()) return -1;
  for (const auto& e : f.end.value("entries", nlohmann::json::array())) {
    if (Str(e, "entry") == entry) return Int(e, "hits");
  }
  return -1;
}

std::string SymbolsText(const nlohmann::json& compile_end) {
  std::vector<std::string> symbols;
  for (const auto& s : compile_end.value("symbols", nlohmann::json::array())) {
    symbols.push_back(absl::StrCat(Str(s, "symbol"), " = ", Str(s, "source"),
                                   s.value("specialized", false) ? " (specialized)" : ""));
  }
  return absl::StrJoin(symbols, ", ");
}

std::string FormatMs(double ms) { return absl::StrFormat("%.2f ms", ms); }

std::string FunctionTitle(const FunctionTrace& f) {
  return absl::StrCat("function '", f.name, "' (id ", f.fn_id, ", pid ", f.pid, ")");
}

std::vector<std::string> FunctionSummary(const FunctionTrace& f) {
  std::vector<std::string> lines;
  if (!f.options.is_null()) {
    lines.push_back(absl::StrCat("options: backend ", Str(f.options, "backend"), ", dynamic ",
                                 Str(f.options, "dynamic"), ", cache_size_limit ", Int(f.options, "cache_size_limit")));
  }
  double compile_ms = 0;
  for (const auto& c : f.compiles) compile_ms += c.value("ms", nlohmann::json::object()).value("total", 0.0);
  size_t recompiles = 0, limits = 0, eager = 0, verified = 0;
  for (const auto& j : f.events) verified += Str(j, "event") == "size_verified";
  for (const auto& m : f.misses) {
    const std::string e = Str(m, "event");
    recompiles += e == "recompile";
    limits += e == "cache_limit";
    eager += e == "eager_fallback";
  }
  if (!f.end.is_null()) {
    lines.push_back(absl::StrCat("calls ", Int(f.end, "calls"), ", cache hits ", Int(f.end, "cache_hits"),
                                 ", compiles ", Int(f.end, "compiles"), ", eager calls ", Int(f.end, "eager_calls")));
  } else {
    lines.push_back(absl::StrCat("compiles ", f.compiles.size(),
                                 " (no function_end event: the process exited before the function was destroyed, "
                                 "so calls and hits are unknown)"));
  }
  lines.push_back(absl::StrCat("recompiles ", recompiles, ", cache-limit misses ", limits, ", eager fallbacks ", eager,
                               verified > 0 ? absl::StrCat(", size verifications (re-traces, no compile) ", verified) : "",
                               ", compile time ", FormatMs(compile_ms)));
  return lines;
}

std::vector<TimelineRow> Timeline(const FunctionTrace& f) {
  std::map<int64_t, TimelineRow> at;  // by call
  for (const auto& j : f.events) {
    const std::string event = Str(j, "event");
    const int64_t call = Int(j, "call");
    if (call < 0) continue;
    TimelineRow row;
    row.first_call = row.last_call = call;
    if (event == "compile_end") {
      row.kind = Str(j, "action") == "compiled" ? "compile" : "recompile";
      row.entry = Str(j, "entry");
      row.text = Str(j, "action");
      row.ms = j.value("ms", nlohmann::json::object()).value("total", -1.0);
      row.args = ArgsShort(j.value("args", nlohmann::json::array()));
    } else if (event == "cache_limit") {
      row.kind = "cache limit";
      row.text = Str(j, "action");
      row.args = ArgsShort(j.value("args", nlohmann::json::array()));
    } else if (event == "eager_fallback") {
      row.kind = "eager fallback";
      row.text = Str(j, "action");
      row.args = ArgsShort(j.value("args", nlohmann::json::array()));
    } else if (event == "size_verified") {
      row.kind = "verified";
      row.entry = Str(j, "entry");
      row.text = Str(j, "action");
      row.args = ArgsShort(j.value("args", nlohmann::json::array()));
    } else if (event == "trace_error") {
      row.kind = "trace error";
      row.text = absl::StrCat("the function raised: ", Str(j, "error"));
    } else if (event == "backend_error") {
      row.kind = "backend error";
      row.text = Str(j, "error");
    } else {
      continue;
    }
    auto it = at.find(call);
    if (it == at.end() || it->second.kind == "trace error") at[call] = row;
  }
  std::vector<TimelineRow> rows;
  int64_t next = 0;
  bool eager = false;
  auto gap = [&](int64_t until) {  // calls [next, until) had no event
    if (until <= next) return;
    TimelineRow row;
    row.first_call = next;
    row.last_call = until - 1;
    const int64_t n = until - next;
    row.kind = eager ? "eager" : "hits";
    row.text = eager ? absl::StrCat(n, n == 1 ? " call" : " calls", " ran eagerly (function not traceable)")
                     : absl::StrCat(n, n == 1 ? " call" : " calls", " served by cache entries");
    rows.push_back(row);
  };
  for (const auto& [call, row] : at) {
    gap(call);
    rows.push_back(row);
    if (row.kind == "eager fallback") eager = true;
    next = call + 1;
  }
  if (!f.end.is_null()) {
    gap(Int(f.end, "calls", next));
  } else {
    TimelineRow row;
    row.first_call = row.last_call = next;
    row.kind = "unknown";
    row.text = "later calls not recorded (no function_end event)";
    rows.push_back(row);
  }
  return rows;
}

// --- Suggestions --------------------------------------------------------------------------------

std::vector<std::string> Suggestions(const FunctionTrace& f) {
  // Failing guards of the closest entry, per property, over the misses that compiled or hit the limit.
  struct Seen {
    std::string kind, text, provenance, name, arg_type;
    int arg = -1, dim = -1;
    std::vector<int64_t> calls;
    std::vector<std::string> values;  // the call's value of the property
  };
  std::map<std::tuple<std::string, int, int, std::string>, Seen> seen;
  std::vector<std::string> out;
  for (const auto& m : f.misses) {
    const std::string event = Str(m, "event");
    if (event == "eager_fallback") continue;
    const nlohmann::json args = m.value("args", nlohmann::json::array());
    const nlohmann::json failing = m.value("closest", nlohmann::json::object()).value("failing", nlohmann::json::array());
    for (const auto& g : failing) {
      const std::string kind = Str(g, "kind");
      const int arg = static_cast<int>(Int(g, "arg"));
      const int dim = static_cast<int>(Int(g, "dim"));
      // Relations and data-dependent values are told apart by their text.
      const std::string key_text = (kind == "size_relation" || kind == "data_value") ? Str(g, "text") : "";
      Seen& s = seen[{kind, arg, dim, key_text}];
      s.kind = kind;
      s.arg = arg;
      s.dim = dim;
      s.text = Str(g, "text");
      s.provenance = Str(g, "provenance");
      s.calls.push_back(Int(m, "call"));
      if (arg >= 0 && arg < static_cast<int>(args.size())) {
        const nlohmann::json& a = args[arg];
        s.name = Str(a, "name");
        s.arg_type = Str(a, "type");
        if (kind == "size" || kind == "size_at_least") {
          const auto sizes = a.value("sizes", nlohmann::json::array());
          if (dim >= 0 && dim < static_cast<int>(sizes.size())) s.values.push_back(sizes[dim].dump());
        } else if (kind == "dtype") {
          s.values.push_back(Str(a, "dtype"));
        } else if (a.contains("value")) {
          s.values.push_back(ScalarText(a["value"]));
        }
      }
      if (s.name.empty()) s.name = arg >= 0 ? absl::StrCat("arg", arg) : "";
    }
  }
  for (const auto& [key, s] : seen) {
    const size_t n = s.calls.size();
    const std::string values = s.values.empty() ? "" : absl::StrCat(" (", JoinValues(s.values), ")");
    if (s.kind == "size") {
      if (n >= 2) {
        out.push_back(absl::StrCat(s.name, ".size(", s.dim, ") changed ", Times(n), values, ": mark_dynamic(", s.arg,
                                   ", ", s.dim, ")"));
      }
    } else if (s.kind == "size_at_least") {
      out.push_back(absl::StrCat(s.name, ".size(", s.dim, ") was below the dynamic bound in ", Times(n), values,
                                 ": sizes 0 and 1 always specialize, so each gets its own entry (expected; pad to 2 "
                                 "if it costs too many compiles)"));
    } else if (s.kind == "int_value" || s.kind == "double_value") {
      if (n >= 2) {
        const char* type = s.kind == "double_value" ? "float" : "int";
        out.push_back(absl::StrCat(s.name, " is a", s.kind == "int_value" ? "n " : " ", type, " that ",
                                   ConsecutiveCalls(s.calls) ? "changes every call" : absl::StrCat("changed ", Times(n)),
                                   values, ": pass it as a 0-dim tensor, or mark_dynamic(", s.arg,
                                   ", 0) if it is only used as an op argument"));
      }
    } else if (s.kind == "bool_value") {
      out.push_back(absl::StrCat(s.name, " is a bool that changed ", Times(n),
                                 ": each value has its own entry (at most two); expected"));
    } else if (s.kind == "dtype") {
      out.push_back(absl::StrCat(s.name, ".dtype changed ", Times(n), values,
                                 ": one entry per dtype; convert to one dtype before calling"));
    } else if (s.kind == "stride") {
      out.push_back(absl::StrCat(s.name, ".stride(", s.dim, ") changed ", Times(n), " (guarded because it was ",
                                 s.provenance, "): pass ", s.name, ".contiguous() or avoid reading strides"));
    } else if (s.kind == "rank") {
      out.push_back(absl::StrCat(s.name, ".dim() changed ", Times(n),
                                 ": each rank has its own entry (dynamic shapes keep the rank)"));
    } else if (s.kind == "requires_grad") {
      out.push_back(absl::StrCat(s.name, ".requires_grad changed ", Times(n),
                                 ": each setting has its own entry; detach() or set it consistently"));
    } else if (s.kind == "grad_mode" || s.kind == "inference_mode") {
      out.push_back(absl::StrCat(s.kind, " differed in ", Times(n),
                                 ": each mode has its own entry; call under one mode (e.g. c10::InferenceMode)"));
    } else if (s.kind == "size_relation") {
      out.push_back(absl::StrCat(s.text, " failed ", Times(n), " (", s.provenance,
                                 "): the arguments' sizes stopped agreeing as that op requires; this is a new shape "
                                 "combination, not something mark_dynamic removes"));
    } else if (s.kind == "data_value") {
      out.push_back(absl::StrCat("a value the function reads from a tensor changed ", Times(n), " (", s.text,
                                 "): each value re-traces; keep it in a tensor (torch::where) instead of branching "
                                 "on item()"));
    } else if (s.kind == "type" || s.kind == "arg_count") {
      out.push_back(absl::StrCat(s.text, " failed ", Times(n), ": pass the same argument types on every call"));
    }
  }
  for (const auto& m : f.misses) {
    if (Str(m, "event") == "cache_limit") {
      out.push_back(absl::StrCat("cache_size_limit (", Int(m, "limit"), ") hit at call ", Int(m, "call"),
                                 ": later new signatures ran eagerly; make the changing dims dynamic (above) or "
                                 "raise Options::cache_size_limit"));
      break;
    }
  }
  for (const auto& m : f.misses) {
    if (Str(m, "event") == "eager_fallback") {
      out.push_back(absl::StrCat("runs eagerly from call ", Int(m, "call"), ": ", Str(m, "reason"),
                                 "; move that read out of the compiled function"));
    }
  }
  for (const auto& e : f.events) {
    if (Str(e, "event") == "backend_fallback") {
      out.push_back(absl::StrCat("entry ", Str(e, "entry"), " uses backend '", Str(e, "used"), "' instead of '",
                                 Str(e, "asked"), "': ", Str(e, "note")));
    }
  }
  return out;
}

// --- Text report --------------------------------------------------------------------------------

namespace {

void AppendIndented(std::string* out, const std::string& text, const std::string& indent) {
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) absl::StrAppend(out, indent, line, "\n");
}

std::string CallRange(const TimelineRow& r) {
  return r.first_call == r.last_call ? absl::StrCat("call ", r.first_call)
                                     : absl::StrCat("calls ", r.first_call, "-", r.last_call);
}

}  // namespace

std::string TextReport(const Trace& trace) {
  std::string out = absl::StrCat("warden report: ", trace.num_events, " events in ", trace.files.size(), " file",
                                 trace.files.size() == 1 ? "" : "s", " (", absl::StrJoin(trace.files, ", "), "), ",
                                 trace.functions.size(), " function", trace.functions.size() == 1 ? "" : "s", "\n");
  for (const std::string& n : trace.notes) absl::StrAppend(&out, "note: ", n, "\n");
  for (const FunctionTrace& f : trace.functions) {
    absl::StrAppend(&out, "\n== ", FunctionTitle(f), " ==\n");
    for (const std::string& line : FunctionSummary(f)) absl::StrAppend(&out, "  ", line, "\n");

    absl::StrAppend(&out, "\ntimeline:\n");
    for (const TimelineRow& r : Timeline(f)) {
      absl::StrAppend(&out, "  ", absl::StrFormat("%-15s %-14s", CallRange(r), r.kind));
      if (!r.entry.empty()) absl::StrAppend(&out, " entry ", r.entry);
      if (r.ms >= 0) absl::StrAppend(&out, " (", FormatMs(r.ms), ")");
      if (r.kind != "compile" && !r.text.empty()) absl::StrAppend(&out, " ", r.text);
      if (!r.args.empty()) absl::StrAppend(&out, "  [", r.args, "]");
      absl::StrAppend(&out, "\n");
    }

    absl::StrAppend(&out, "\ncache entries (", f.compiles.size(), "):\n");
    for (const auto& c : f.compiles) {
      const std::string entry = Str(c, "entry");
      const int64_t hits = EntryHits(f, entry);
      const nlohmann::json ms = c.value("ms", nlohmann::json::object());
      absl::StrAppend(&out, "\n  entry ", entry, ": created at call ", Int(c, "call"), ", backend ", Str(c, "backend"),
                      ", hits ", hits >= 0 ? absl::StrCat(hits) : "unknown", "\n");
      absl::StrAppend(&out, "    compile: ", FormatMs(ms.value("total", 0.0)), " (trace ", FormatMs(ms.value("trace", 0.0)),
                      ", guards ", FormatMs(ms.value("guards", 0.0)), ", backend ", FormatMs(ms.value("backend", 0.0)),
                      ")\n");
      absl::StrAppend(&out, "    compiled for: ", ArgsShort(c.value("args", nlohmann::json::array())), "\n");
      if (!Str(c, "backend_note").empty()) absl::StrAppend(&out, "    note: ", Str(c, "backend_note"), "\n");
      const std::string symbols = SymbolsText(c);
      if (!symbols.empty()) absl::StrAppend(&out, "    symbols: ", symbols, "\n");
      for (const auto& n : c.value("scalar_notes", nlohmann::json::array())) {
        absl::StrAppend(&out, "    scalar: ", n.get<std::string>(), "\n");
      }
      absl::StrAppend(&out, "    graph:\n");
      AppendIndented(&out, Str(c, "graph"), "      ");
      const nlohmann::json guards = c.value("guards", nlohmann::json::array());
      absl::StrAppend(&out, "    guards (", guards.size(), "), each with what required it:\n");
      for (const auto& g : guards) {
        absl::StrAppend(&out, "      ", Str(g, "text"), "  # ", Str(g, "provenance"), "\n");
      }
    }

    absl::StrAppend(&out, "\nrecompiles and other misses (", f.misses.size(), "):\n");
    for (const auto& m : f.misses) {
      absl::StrAppend(&out, "\n  call ", Int(m, "call"), ": ", Str(m, "action"));
      if (!Str(m, "entry").empty()) absl::StrAppend(&out, " -> entry ", Str(m, "entry"));
      absl::StrAppend(&out, "\n");
      if (!m.value("reasons", nlohmann::json::array()).empty()) {
        absl::StrAppend(&out, "    reasons (most recently used entry first):\n");
      }
      for (const auto& r : m.value("reasons", nlohmann::json::array())) {
        absl::StrAppend(&out, "      - ", Str(r, "entry"), ": ", Str(r, "reason"), "\n");
      }
      const nlohmann::json closest = m.value("closest", nlohmann::json::object());
      if (closest.contains("entry")) {
        const nlohmann::json failing = closest.value("failing", nlohmann::json::array());
        absl::StrAppend(&out, "    closest entry ", Str(closest, "entry"), ": ", failing.size(), " of ",
                        Int(closest, "num_guards"), " guards failed\n");
        for (const auto& g : failing) {
          absl::StrAppend(&out, "      ", Str(g, "text"), "  # ", Str(g, "provenance"), "\n");
          absl::StrAppend(&out, "        failed: ", Str(g, "reason"), "\n");
        }
        const nlohmann::json compiled = EntryCompile(f, Str(closest, "entry"));
        if (!compiled.is_null()) {
          const auto diff = ArgDiff(compiled.value("args", nlohmann::json::array()), m.value("args", nlohmann::json::array()));
          absl::StrAppend(&out, "    arguments (entry ", Str(closest, "entry"), " was compiled for -> this call):",
                          diff.empty() ? " no visible difference\n" : "\n");
          for (const ArgChange& d : diff) absl::StrAppend(&out, "      ", d.name, ": ", d.before, " -> ", d.after, "\n");
        }
      }
    }

    const std::vector<std::string> suggestions = Suggestions(f);
    absl::StrAppend(&out, "\nsuggestions (", suggestions.size(), "):\n");
    for (const std::string& s : suggestions) absl::StrAppend(&out, "  - ", s, "\n");
    if (suggestions.empty()) absl::StrAppend(&out, "  (none: every recompile was expected)\n");
  }
  return out;
}

// --- warden explain -----------------------------------------------------------------------------

absl::StatusOr<std::string> ExplainText(const std::string& json_text) {
  nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("function")) {
    return absl::InvalidArgumentError("not an explain_json() document (expected a JSON object with \"function\")");
  }
  const nlohmann::json options = doc.value("options", nlohmann::json::object());
  const nlohmann::json stats = doc.value("stats", nlohmann::json::object());
  std::string out = absl::StrCat("function '", Str(doc, "function"), "' (id ", Int(doc, "id"), ", backend ",
                                 Str(options, "backend"), ", dynamic ", Str(options, "dynamic"), ", cache_size_limit ",
                                 Int(options, "cache_size_limit"), ")\n");
  absl::StrAppend(&out, "  calls ", Int(stats, "calls"), ", cache hits ", Int(stats, "cache_hits"), ", compiles ",
                  Int(stats, "compiles"), ", eager calls ", Int(stats, "eager_calls"),
                  Int(stats, "size_verifications", 0) > 0
                      ? absl::StrCat(", size verifications ", Int(stats, "size_verifications", 0))
                      : "",
                  "\n");
  if (!Str(doc, "eager_reason").empty()) absl::StrAppend(&out, "  runs eagerly: ", Str(doc, "eager_reason"), "\n");
  const nlohmann::json entries = doc.value("entries", nlohmann::json::array());
  absl::StrAppend(&out, "  ", entries.size(), " cache entr", entries.size() == 1 ? "y" : "ies",
                  " (most recently used first)\n");
  for (const auto& e : entries) {
    absl::StrAppend(&out, "\nentry ", Str(e, "id"), ": backend ", Str(e, "backend"), ", created at call ",
                    Int(e, "created_at_call"), ", hits ", Int(e, "hits"), "\n");
    if (!Str(e, "backend_note").empty()) absl::StrAppend(&out, "  note: ", Str(e, "backend_note"), "\n");
    if (!Str(e, "kernel_library").empty()) {
      const int64_t regions = Int(e, "fused_regions", 0);
      absl::StrAppend(&out, "  kernels: ", regions, " fused region", regions == 1 ? "" : "s", " in ",
                      Str(e, "kernel_library"), " (source beside it; WARDEN_LOGS=output_code prints it)\n");
    }
    for (const auto& m : e.value("rule_mismatches", nlohmann::json::array())) {
      absl::StrAppend(&out, "  rule mismatch: ", m.get<std::string>(), "\n");
    }
    for (const auto& m : e.value("scalar_notes", nlohmann::json::array())) {
      absl::StrAppend(&out, "  scalar: ", m.get<std::string>(), "\n");
    }
    if (!Str(e, "verified_sizes").empty()) absl::StrAppend(&out, "  ", Str(e, "verified_sizes"), "\n");
    absl::StrAppend(&out, "  graph:\n");
    AppendIndented(&out, Str(e, "graph"), "    ");
    const nlohmann::json guards = e.value("guards", nlohmann::json::array());
    absl::StrAppend(&out, "  guards (", guards.size(), "):\n");
    for (const auto& g : guards) {
      absl::StrAppend(&out, "    ", Str(g, "text"), "  # ", Str(g, "provenance"), "\n");
    }
  }
  const nlohmann::json events = doc.value("recompiles", nlohmann::json::array());
  const int64_t dropped = Int(doc, "dropped_recompiles", 0);
  absl::StrAppend(&out, "\nrecompiles (", events.size(), dropped > 0 ? absl::StrCat(", ", dropped, " older dropped") : "",
                  "):\n");
  for (const auto& ev : events) {
    absl::StrAppend(&out, "  call ", Int(ev, "call_index"), ": ", Str(ev, "action"), "\n");
    for (const auto& r : ev.value("reasons", nlohmann::json::array())) {
      absl::StrAppend(&out, "    - ", r.get<std::string>(), "\n");
    }
  }
  return out;
}

}  // namespace warden::report
