// `warden report` and `warden explain`: reading WARDEN_TRACE_DIR's JSON-lines files (Note [Trace
// events] in runtime/trace_log.h) into per-function timelines, and rendering them as plain text or
// as one self-contained HTML page; suggestions derived from the recompile reasons; a readable
// rendering of a saved explain_json() document. No Warden runtime dependency: only the files.
#ifndef WARDEN_TOOLS_REPORT_LIB_H_
#define WARDEN_TOOLS_REPORT_LIB_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace warden::report {

// Everything the trace says about one compiled function (one compile() call in one process).
struct FunctionTrace {
  int64_t pid = 0;
  int fn_id = 0;
  std::string name;
  nlohmann::json options;                  // the "function" event (null if not in the trace)
  std::vector<nlohmann::json> events;      // every event of the function, in file order
  std::vector<nlohmann::json> compiles;    // "compile_end", in call order
  std::vector<nlohmann::json> misses;      // "recompile", "cache_limit", "eager_fallback", in call order
  nlohmann::json end;                      // "function_end" (null: the process exited first)
};

struct Trace {
  std::vector<std::string> files;          // base names, sorted
  int64_t num_events = 0;
  std::vector<std::string> notes;          // truncation, unparsable lines
  std::vector<FunctionTrace> functions;    // by pid, then function id
};

// --- Building blocks shared by the text and HTML renderings ---------------------------------

// An event's field `key`: "" (or `fallback`) when it is absent or of another type.
std::string Str(const nlohmann::json& j, const char* key);
int64_t Int(const nlohmann::json& j, const char* key, int64_t fallback = -1);

// One row of a function's timeline: a miss or compile at one call, or a run of calls between them.
struct TimelineRow {
  int64_t first_call = 0, last_call = 0;
  std::string kind;   // compile, recompile, cache limit, eager fallback, trace error, backend error,
                      // hits, eager, unknown
  std::string entry;  // "F/E" of the entry it created, if any
  std::string text;   // action, reason or error
  std::string args;   // the call's arguments, short form
  double ms = -1;     // compile time, -1 if none
};
std::vector<TimelineRow> Timeline(const FunctionTrace& f);

// "arg0: f32[4, 16, 64]", "alpha: Double 0.5".
std::string ArgShort(const nlohmann::json& arg);
std::string ArgsShort(const nlohmann::json& args);

// The arguments that differ between an entry's compile and a call: (name, before, after).
struct ArgChange {
  std::string name, before, after;
};
std::vector<ArgChange> ArgDiff(const nlohmann::json& before, const nlohmann::json& after);

// The "compile_end" of entry "F/E" (null if absent) and its hits from "function_end" (-1: unknown).
nlohmann::json EntryCompile(const FunctionTrace& f, const std::string& entry);
int64_t EntryHits(const FunctionTrace& f, const std::string& entry);

// "function 'mlp' (id 1, pid 42)" and the options/stats lines under it.
std::string FunctionTitle(const FunctionTrace& f);
std::vector<std::string> FunctionSummary(const FunctionTrace& f);

// "s0 = arg0.size(0), s1 = ..." of a "compile_end" event; "" without symbols.
std::string SymbolsText(const nlohmann::json& compile_end);

std::string FormatMs(double ms);  // "1.23 ms"

// Parses JSON-lines texts given as (file name, contents).
Trace ParseTrace(const std::vector<std::pair<std::string, std::string>>& files);

// Reads every *.jsonl file of `path` (a directory), or the one file `path` names.
absl::StatusOr<Trace> LoadTrace(const std::string& path);

// The cache keys of the kernel libraries a traced run used (the "kernel_library" of its
// "disk_cache" events), from a WARDEN_TRACE_DIR or one trace file.
absl::StatusOr<std::set<std::string>> KernelKeysUsed(const std::string& path);

// What to change, derived from the misses: "arg0.size(0) changed 6 times: mark_dynamic(0, 0)".
std::vector<std::string> Suggestions(const FunctionTrace& f);

// The plain-text report (`warden report --text`): stable, for golden tests.
std::string TextReport(const Trace& trace);

// The self-contained HTML report. `dot` is the path of Graphviz's dot for SVG graphs; empty:
// graphs as text.
std::string HtmlReport(const Trace& trace, const std::string& dot);

// Graphviz source for a graph in Warden's canonical text form (tracer::Graph::ToString).
std::string GraphDot(const std::string& graph_text);

// `dot` from PATH, or "" if it is not installed.
std::string FindDot();

// A saved CompiledFunction::explain_json() document, printed like explain().
absl::StatusOr<std::string> ExplainText(const std::string& json_text);

}  // namespace warden::report

#endif  // WARDEN_TOOLS_REPORT_LIB_H_
