// WARDEN_TRACE_DIR: the structured trace that `warden report` reads. One JSON-lines file per
// process (<dir>/warden-<pid>.jsonl), written by a process-wide TraceLog, plus the JSON renderings
// of arguments and guards that the events carry. Which events exist and when they are emitted is
// decided by compiled_function.cc (Note [Trace events]); nothing here is on the hit path.
#ifndef WARDEN_RUNTIME_TRACE_LOG_H_
#define WARDEN_RUNTIME_TRACE_LOG_H_

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

#include "guards/guard.h"

namespace warden::runtime {

// Note [Trace events]
// Every line is one object with "event" (its type), "seq" (order in the file), "t_us" (since the
// log was opened), "pid", and, for events about a function, "fn" (its name), "fn_id" (F of "F/E")
// and "call" (the 0-based user call index). Types: "trace_start" (first line: pid, argv),
// "function" (compile(): options), "compile_start", "compile_end" (entry, timings in ms, backend,
// graph, guards with provenance, the call's arguments), "recompile" (reasons per entry, action,
// the closest entry and which of its guards failed), "cache_limit", "eager_fallback",
// "trace_error", "backend_fallback", "backend_error", "background_compile_end" (an async_compile
// job finished: entry, backend now used, note, ms, error if any), "disk_cache" (kernel cache hits and
// compiler runs during one compile), "function_end" (stats and per-entry hits, when the function
// is destroyed) and "truncated" (the size cap was reached; nothing follows).
// Only misses emit events: hits are the calls between them, counted by "function_end".
class TraceLog {
 public:
  // The process's log for $WARDEN_TRACE_DIR (read now), or nullptr when it is unset or empty. The
  // file is created on the first event. $WARDEN_TRACE_MAX_BYTES overrides the cap (kDefaultMaxBytes).
  static TraceLog* FromEnv();

  static constexpr int64_t kDefaultMaxBytes = int64_t{64} << 20;

  // Appends `fields` as one line, adding "event", "seq", "t_us" and "pid". Thread-safe. Once the
  // file would exceed the cap, writes one "truncated" event and drops everything after it. I/O
  // errors disable the log with one warning; they never reach the caller.
  void Emit(const std::string& event, nlohmann::json fields);

  std::string path() const;

  TraceLog(std::string dir, int64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}
  TraceLog(const TraceLog&) = delete;
  TraceLog& operator=(const TraceLog&) = delete;

 private:
  bool OpenLocked();  // requires mu_

  const std::string dir_;
  const int64_t max_bytes_;
  mutable std::mutex mu_;
  std::FILE* file_ = nullptr;
  std::string path_;
  bool failed_ = false;     // could not open or write: silent from then on
  bool truncated_ = false;  // the cap was reached
  int64_t bytes_ = 0;
  int64_t seq_ = 0;
  int64_t start_us_ = 0;
};

// The call's arguments as the report shows them: [{"name", "type", "dtype", "sizes", "strides",
// "device", "requires_grad"} for tensors, {"name", "type", "value"} for scalars].
nlohmann::json ArgsJson(const std::vector<c10::IValue>& args, const std::vector<std::string>& names);

// Every guard with its kind, text, provenance and argument/dim.
nlohmann::json GuardsJson(const std::vector<guards::Guard>& guards, const std::vector<std::string>& names);

// The guards of `guards` that fail on `args`, each with its reason text: the diff between an
// entry and a call that missed it. Tensor guards of an argument whose type guard failed are
// skipped (they would only repeat it).
nlohmann::json FailingGuardsJson(const std::vector<guards::Guard>& guards, const std::vector<c10::IValue>& args,
                                 const std::vector<std::string>& names);

}  // namespace warden::runtime

#endif  // WARDEN_RUNTIME_TRACE_LOG_H_
