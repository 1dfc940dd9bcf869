// compile() and the call path of a CompiledFunction: guard check against the current snapshot
// (hit), otherwise trace + build guards + compile + publish (miss), with the recompile event.
#include <algorithm>
#include <chrono>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "guards/builder.h"
#include "runtime/codegen_artifact.h"
#include "runtime/codegen_compiler.h"
#include "runtime/codegen_replay.h"
#include "runtime/compile_pool.h"
#include "runtime/dynamism_profile.h"
#include "runtime/hazard.h"
#include "runtime/function_impl.h"
#include "runtime/symbolic_scalars.h"
#include "tracer/tracer.h"

namespace warden {
namespace {

std::atomic<int> next_function_id{0};

void ValidateArgs(const std::vector<c10::IValue>& args, const CompiledFunction::Impl& f) {
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& a = args[i];
    if (a.isTensor() || a.isInt() || a.isDouble() || a.isBool()) continue;
    throw Error(absl::StrCat("warden: function '", f.options_.name, "': argument '", f.ArgName(i),
                             "' has unsupported type ", a.tagKind(),
                             "; arguments must be tensors, ints, doubles or bools"));
  }
}

struct Compiled {
  std::unique_ptr<Artifact> artifact;
  std::string backend;  // the one that produced it
  std::string note;     // why it is not the one asked for
};

// WARDEN_LOGS=output_code: the generated source and where its library lives.
void LogOutputCode(const Artifact& artifact, const std::string& where) {
  const auto* codegen = dynamic_cast<const CodegenArtifact*>(&artifact);
  if (codegen == nullptr) return;
  runtime::LogToStderr(absl::StrCat(
      "warden: output code of ", where, " (", codegen->library_path().empty() ? "no library" : codegen->library_path(),
      "):\n", codegen->source().empty() ? "// nothing fused: every node is an ATen call\n" : codegen->source()));
}

// Compiles `graph` with backend `name`; if that backend fails (no compiler, a compile error, ...),
// with "aten" instead, warning once per function with the backend's message.
absl::StatusOr<Compiled> CompileWithFallback(const std::string& name, const std::shared_ptr<const tracer::Graph>& graph,
                                             const CompileContext& context, int function_id,
                                             const std::string& where) {
  Compiled c;
  std::unique_ptr<Backend> backend = MakeBackend(name);
  if (backend == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown backend '", name, "' (registered: ",
                                            absl::StrJoin(BackendNames(), ", "), ")"));
  }
  auto artifact = backend->Compile(graph, context);
  if (!artifact.ok() && backend->name() != "aten") {
    c.note = absl::StrCat("backend '", backend->name(), "' failed (", artifact.status().message(),
                          "); using 'aten'");
    runtime::WarnOnce(absl::StrCat("backend-failed-", function_id),
                      absl::StrCat("warden: function '", context.function_name, "': ", c.note));
    backend = MakeBackend("aten");
    artifact = backend->Compile(graph, context);
  }
  if (!artifact.ok()) return artifact.status();
  c.artifact = *std::move(artifact);
  c.backend = backend->name();
  if (context.output_code) LogOutputCode(*c.artifact, where);
  return c;
}

// Note [Verified size reads], steps 1 and 2: `shapes` (a pass with verify_reads) left some sizes
// C++ read symbolic. Finds an earlier entry whose trace differs from `trace` only in those sizes,
// makes trace.graph the generalized graph and `shapes` its pass, and returns the entry's set with
// this call's sizes in it; null (and `why`) when no entry's trace matches or the check fails.
std::shared_ptr<runtime::VerifiedSizes> GeneralizeReads(tracer::TraceResult& trace,
                                                        const std::vector<std::shared_ptr<const CacheEntry>>& entries,
                                                        const std::set<std::pair<int, int>>& dynamic,
                                                        const std::vector<std::string>& names, ops::ShapePassResult* shapes,
                                                        std::string* why, bool* pending) {
  *pending = false;
  std::vector<std::pair<int, int>> read_dims;
  std::vector<std::string> read_names;
  // Also those a rule specialized: in the traced graph their values are still plain constants
  // (view(x, [4, -1]) cannot divide s0*6 by 4); the generalized graph's pass decides.
  for (const auto& [k, reader] : shapes->read_symbols) {
    read_dims.emplace_back(shapes->symbols[k].arg, shapes->symbols[k].dim);
    read_names.push_back(ops::SymbolName(shapes->symbols[k], names));
  }
  if (read_dims.empty()) return nullptr;
  if (!shapes->stride_read.empty()) {
    // C++ read strides: the strides of every tensor argument join the verified tuple.
    const tracer::Graph& g = *trace.graph;
    for (size_t arg = 0; arg < g.arg_values.size(); ++arg) {
      if (g.arg_values[arg] == tracer::kNoValue || !g.value(g.arg_values[arg]).is_tensor) continue;
      const size_t rank = g.value(g.arg_values[arg]).meta.strides.size();
      for (size_t d = 0; d < rank; ++d) {
        read_dims.emplace_back(static_cast<int>(arg), runtime::VerifiedSizes::StrideDim(static_cast<int>(d)));
        read_names.push_back(absl::StrCat(arg < names.size() ? names[arg] : absl::StrCat("arg", arg), ".stride(", d, ")"));
      }
    }
  }
  const std::string what = absl::StrJoin(read_names, ", ");
  for (const auto& e : entries) {
    if (e->verified != nullptr) continue;  // only plain traces: a generalized graph has its own set
    tracer::TraceResult before;
    before.graph = std::const_pointer_cast<tracer::Graph>(e->graph);
    before.reads = e->reads;
    std::string diff;
    std::shared_ptr<tracer::Graph> general = runtime::Generalize(trace, before, read_dims, &diff);
    if (general == nullptr) {
      if (why->empty()) *why = absl::StrCat(what, " read by C++ stays static: unlike entry ", e->index, "'s trace, ", diff);
      continue;
    }
    ops::ShapePassResult pass = ops::PropagateShapes(*general, trace.reads, dynamic, /*verify_reads=*/true);
    general = ops::WithRunTimeSizes(std::move(general), pass);  // Note [Symbolic sizes]
    std::string mismatch;
    for (const auto& [arg, dim] : read_dims) {
      for (size_t k = 0; k < pass.symbols.size(); ++k) {
        if (pass.symbols[k].arg != arg || pass.symbols[k].dim != dim) continue;
        auto sp = pass.specialized.find(static_cast<int>(k));
        if (sp != pass.specialized.end() && mismatch.empty()) mismatch = absl::StrCat("in the generalized graph, ", sp->second);
      }
    }
    if (mismatch.empty()) mismatch = runtime::InstanceMismatch(*general, trace.reads, pass, trace);
    if (mismatch.empty()) {
      // The earlier trace must be an instance too (unless its sizes are 0 or 1, outside the symbols'
      // domain): otherwise a rule lost the symbol and every new value would fail verification.
      const std::string earlier = runtime::InstanceMismatch(*general, trace.reads, pass, before);
      if (!earlier.empty() && earlier != "a symbolic size is 0 or 1") mismatch = absl::StrCat("entry ", e->index, ": ", earlier);
    }
    if (!mismatch.empty()) {
      if (why->empty()) *why = absl::StrCat(what, " read by C++ stays static: ", mismatch);
      continue;
    }
    auto verified = std::make_shared<runtime::VerifiedSizes>(read_dims, read_names);
    trace.graph = std::move(general);
    *shapes = std::move(pass);
    verified->Add(verified->TupleOf(*trace.graph));
    return verified;
  }
  if (why->empty()) {
    *pending = true;  // no earlier trace to compare with: the next size's miss generalizes
    *why = absl::StrCat(what, " read by C++: static until a second size shows what depends on it");
  }
  return nullptr;
}

CompileContext ContextOf(const CacheEntry& entry, const Options& options, const runtime::LogTopics& logs) {
  CompileContext context;
  context.function_name = options.name;
  context.output_code = logs.output_code;
  if (entry.shapes != nullptr) {
    const auto& shapes = entry.shapes->shapes;
    context.symbolic_shape.resize(shapes.size(), false);
    for (size_t v = 0; v < shapes.size(); ++v) {
      for (const ops::Dim& d : shapes[v]) {
        if (!d.is_constant()) context.symbolic_shape[v] = true;
      }
    }
  }
  return context;
}

// --- WARDEN_TRACE_DIR (Note [Trace events]); called only when the function has a trace log ------

using TraceClock = std::chrono::steady_clock;

double Millis(TraceClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

nlohmann::json TraceFields(const CompiledFunction::Impl& f, int64_t call_index) {
  return {{"fn", f.options_.name}, {"fn_id", f.id_}, {"call", call_index}};
}

std::string EntryId(const CompiledFunction::Impl& f, int index) { return absl::StrCat(f.id_, "/", index); }

// A miss against existing entries: the reason per entry (most recently used first), the action,
// the call's arguments, and the closest entry (fewest failing guards) with every guard of it that
// failed, each with its reason: the diff `warden report` shows and builds suggestions from.
void TraceMiss(const CompiledFunction::Impl& f, const std::string& type, const RecompileEvent& event,
               const std::vector<std::shared_ptr<const CacheEntry>>& entries, const std::vector<c10::IValue>& args,
               const std::vector<std::string>& names, const std::map<int, std::string>& failures,
               nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json j = TraceFields(f, event.call_index);
  j.update(extra);
  j["action"] = event.action;
  j["args"] = runtime::ArgsJson(args, names);
  nlohmann::json reasons = nlohmann::json::array();
  nlohmann::json closest;
  for (size_t i = 0; i < entries.size(); ++i) {
    const CacheEntry& e = *entries[i];
    reasons.push_back({{"entry", EntryId(f, e.index)}, {"reason", i < event.reasons.size() ? event.reasons[i] : ""}});
    nlohmann::json failing = runtime::FailingGuardsJson(e.program.guards(), args, names);
    auto value = failures.find(e.index);
    const std::string module_failure = failing.empty() ? e.modules.FirstFailure() : "";
    if (!module_failure.empty()) {
      failing.push_back({{"kind", "module"}, {"text", module_failure}, {"provenance", "watched module"},
                         {"reason", module_failure}});
    }
    if (failing.empty() && value != failures.end()) {
      failing.push_back({{"kind", "data_value"}, {"text", value->second}, {"provenance", "value guard in the artifact"},
                         {"reason", value->second}});
    }
    if (closest.is_null() || failing.size() < closest["failing"].size()) {
      closest = {{"entry", EntryId(f, e.index)}, {"num_guards", e.program.guards().size()}, {"failing", failing}};
    }
  }
  j["reasons"] = reasons;
  if (!closest.is_null()) j["closest"] = closest;
  f.trace_->Emit(type, std::move(j));
}

// A new entry: timings, backend, graph and guards with provenance; a backend fallback and the
// kernel cache's activity during the compile (process-wide counters: approximate when other
// functions compile at the same time) as their own events.
void TraceCompiled(const CompiledFunction::Impl& f, const CacheEntry& e, const std::vector<c10::IValue>& args,
                   const std::vector<std::string>& names, const std::string& action, nlohmann::json ms,
                   const codegen::KernelCacheStats& kernels_before) {
  nlohmann::json j = TraceFields(f, e.created_at_call);
  const std::string entry = EntryId(f, e.index);
  j["entry"] = entry;
  j["action"] = action;
  j["ms"] = std::move(ms);
  j["backend"] = e.artifact.backend();
  j["backend_note"] = e.artifact.note();
  j["args"] = runtime::ArgsJson(args, names);
  j["graph"] = GraphText(e);
  j["num_nodes"] = e.graph->nodes.size();
  j["guards"] = runtime::GuardsJson(e.program.guards(), names);
  j["rule_mismatches"] = e.rule_mismatches;
  j["scalar_notes"] = e.scalar_notes;
  nlohmann::json symbols = nlohmann::json::array();
  if (e.shapes != nullptr) {
    for (size_t k = 0; k < e.shapes->symbols.size(); ++k) {
      symbols.push_back({{"symbol", absl::StrCat("s", k)}, {"source", ops::SymbolName(e.shapes->symbols[k], names)},
                         {"specialized", e.shapes->specialized.count(static_cast<int>(k)) > 0}});
    }
  }
  j["symbols"] = symbols;
  f.trace_->Emit("compile_end", std::move(j));
  if (e.artifact.backend() != f.options_.backend && !e.artifact.note().empty()) {
    nlohmann::json b = TraceFields(f, e.created_at_call);
    b["entry"] = entry;
    b["asked"] = f.options_.backend;
    b["used"] = e.artifact.backend();
    b["note"] = e.artifact.note();
    f.trace_->Emit("backend_fallback", std::move(b));
  }
  const codegen::KernelCacheStats now = codegen::GetKernelCacheStats();
  if (now.compiles != kernels_before.compiles || now.disk_hits != kernels_before.disk_hits ||
      now.discarded != kernels_before.discarded || now.failures != kernels_before.failures ||
      now.remote_hits != kernels_before.remote_hits || now.package_hits != kernels_before.package_hits ||
      now.rejected != kernels_before.rejected) {
    nlohmann::json d = TraceFields(f, e.created_at_call);
    d["entry"] = entry;
    d["disk_hits"] = now.disk_hits - kernels_before.disk_hits;
    d["compiler_runs"] = now.compiles - kernels_before.compiles;
    d["discarded"] = now.discarded - kernels_before.discarded;
    d["failures"] = now.failures - kernels_before.failures;
    d["remote_hits"] = now.remote_hits - kernels_before.remote_hits;
    d["package_hits"] = now.package_hits - kernels_before.package_hits;
    d["rejected"] = now.rejected - kernels_before.rejected;
    if (const auto* c = dynamic_cast<const CodegenArtifact*>(e.artifact.get())) {
      d["origin"] = c->kernel_origin();
      d["kernel_library"] = c->library_path();
    }
    d["cache_dir"] = codegen::KernelCacheDirInUse();
    f.trace_->Emit("disk_cache", std::move(d));
  }
}

std::string CurrentExceptionText() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

CompiledFunction::Impl::Impl(Fn fn, Options options, int id)
    : fn_(std::move(fn)), options_(std::move(options)), id_(id), logs_(runtime::LogTopics::FromEnv()),
      trace_(runtime::TraceLog::FromEnv()) {
  Publish({});
  if (trace_ != nullptr) {
    const char* dynamic[] = {"static", "auto", "dynamic"};
    nlohmann::json j = {{"fn", options_.name}, {"fn_id", id_}, {"backend", options_.backend},
                        {"dynamic", dynamic[static_cast<int>(options_.dynamic)]},
                        {"cache_size_limit", options_.cache_size_limit},
                        {"fail_on_cache_limit", options_.fail_on_cache_limit},
                        {"async_compile", options_.async_compile}, {"arg_names", options_.arg_names}};
    trace_->Emit("function", std::move(j));
  }
}

CompiledFunction::Impl::~Impl() {
  // Queued background compiles are dropped, running ones waited for (Note [Compile pool]).
  runtime::CompilePool::Get().Cancel(jobs_);
  if (trace_ != nullptr) {
    nlohmann::json entries = nlohmann::json::array();
    for (const auto& e : snapshot_.load()->entries) {
      entries.push_back({{"entry", EntryId(*this, e->index)}, {"created_at_call", e->created_at_call},
                         {"hits", e->hits.load()}, {"backend", e->artifact.backend()}});
    }
    trace_->Emit("function_end", {{"fn", options_.name}, {"fn_id", id_}, {"calls", Calls()},
                                  {"cache_hits", Hits()}, {"compiles", compiles_.load()},
                                  {"eager_calls", eager_calls_.load()}, {"size_verifications", verifications_.load()},
                                  {"eager_reason", eager_reason_},
                                  {"entries", entries}});
  }
}

std::string CompiledFunction::Impl::ArgName(size_t i) const {
  if (i < options_.arg_names.size() && !options_.arg_names[i].empty()) return options_.arg_names[i];
  return absl::StrCat("arg", i);
}

std::vector<std::string> CompiledFunction::Impl::ArgNames(size_t n) const {
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i) names.push_back(ArgName(i));
  return names;
}

std::vector<std::shared_ptr<const CacheEntry>> CompiledFunction::Impl::EntriesMru() const {
  std::vector<std::shared_ptr<const CacheEntry>> entries = snapshot_.load()->entries;
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    const int64_t ua = std::max(a->last_used.load(), a->created_at_call);
    const int64_t ub = std::max(b->last_used.load(), b->created_at_call);
    if (ua != ub) return ua > ub;
    return a->index > b->index;
  });
  return entries;
}

void CompiledFunction::Impl::Publish(std::vector<std::shared_ptr<const CacheEntry>> entries) {
  auto snap = std::make_unique<Snapshot>();
  snap->entries = std::move(entries);
  for (const auto& e : snap->entries) {
    Snapshot::Group* group = nullptr;
    for (Snapshot::Group& g : snap->groups) {
      if (g.mask == e->signature.mask) group = &g;
    }
    if (group == nullptr) {
      snap->groups.push_back({e->signature.mask, {}, {}});
      group = &snap->groups.back();
    }
    group->entries.push_back(e.get());
  }
  for (Snapshot::Group& g : snap->groups) {
    std::vector<const guards::Signature*> signatures;
    for (const CacheEntry* e : g.entries) signatures.push_back(&e->signature);
    g.index = guards::SignatureIndex(signatures);
  }
  snapshot_.store(snap.get(), std::memory_order_release);
  if (current_ != nullptr) retired_.push_back(std::move(current_));
  current_ = std::move(snap);
  // Free the retired snapshots no hot-path reader holds (Note [Reclaiming snapshots]).
  std::vector<const void*> held;
  if (!retired_.empty() && runtime::hazard::Scan(overflow_readers_, &held)) {
    retired_.erase(std::remove_if(retired_.begin(), retired_.end(),
                                  [&](const std::unique_ptr<Snapshot>& r) {
                                    return std::find(held.begin(), held.end(), r.get()) == held.end();
                                  }),
                   retired_.end());
  }
}

void CompiledFunction::Impl::RecordEvent(RecompileEvent event) {
  if (events_.size() >= kMaxEvents) {
    events_.erase(events_.begin());
    ++dropped_events_;
  }
  events_.push_back(std::move(event));
}

std::set<std::pair<int, int>> CompiledFunction::Impl::DynamicDims(
    const std::vector<c10::IValue>& args,
    const std::vector<std::shared_ptr<const CacheEntry>>& entries,
    std::set<std::pair<int, int>>* newly_dynamic) {
  std::set<std::pair<int, int>> dims;
  auto rank_of = [&](size_t i) -> int64_t {
    return args[i].isTensor() && args[i].toTensor().defined() ? args[i].toTensor().dim() : -1;
  };
  if (options_.dynamic == Dynamic::kAuto && entries.empty() && auto_dynamic_.empty() && !profile_checked_) {
    // Note [Dynamism profiles]: what earlier processes learned about this function.
    profile_checked_ = true;
    const runtime::DynamismProfile profile = runtime::LoadDynamismProfile(options_.name, fn_.target_type().name(), args);
    profile_note_ = profile.note;
    if (!profile.dims.empty()) {
      auto_dynamic_ = profile.dims;
      newly_dynamic->insert(profile.dims.begin(), profile.dims.end());
      std::vector<std::string> dims;
      for (const auto& [arg, dim] : profile.dims) dims.push_back(absl::StrCat(ArgName(arg), ".size(", dim, ")"));
      profile_note_ = absl::StrCat(absl::StrJoin(dims, ", "), " dynamic from the first compile (dynamism profile ",
                                   profile.path, "; WARDEN_DYNAMISM_PROFILES=0 turns it off)");
    }
  }
  if (options_.dynamic == Dynamic::kAuto && !entries.empty()) {
    // Automatic dynamic: a dim whose size differs from the most recently used entry's trace
    // becomes symbolic from now on; a rank change makes the whole argument symbolic.
    const tracer::Graph& prev = *entries.front()->graph;
    for (size_t i = 0; i < args.size() && i < prev.arg_values.size(); ++i) {
      if (prev.arg_values[i] == tracer::kNoValue || rank_of(i) < 0) continue;
      const auto& before = prev.value(prev.arg_values[i]).meta.sizes;
      const auto now = args[i].toTensor().sizes();
      const int a = static_cast<int>(i);
      if (static_cast<int64_t>(before.size()) != rank_of(i)) {
        for (int64_t d = 0; d < rank_of(i); ++d) {
          if (auto_dynamic_.insert({a, static_cast<int>(d)}).second) newly_dynamic->insert({a, static_cast<int>(d)});
        }
        continue;
      }
      for (size_t d = 0; d < before.size(); ++d) {
        if (before[d] != now[d] && auto_dynamic_.insert({a, static_cast<int>(d)}).second) {
          newly_dynamic->insert({a, static_cast<int>(d)});
        }
      }
    }
  }
  if (options_.dynamic == Dynamic::kAuto) {
    dims = auto_dynamic_;
    if (!entries.empty() && !newly_dynamic->empty()) runtime::SaveDynamismProfile(options_.name, fn_.target_type().name(), args, auto_dynamic_);
  }
  for (size_t i = 0; i < args.size(); ++i) {
    for (int64_t d = 0; d < rank_of(i); ++d) {
      const std::pair<int, int> key{static_cast<int>(i), static_cast<int>(d)};
      auto hint = dim_hints_.find(key);
      if (hint != dim_hints_.end()) {
        if (hint->second) {
          dims.insert(key);
        } else {
          dims.erase(key);
        }
      } else if (options_.dynamic == Dynamic::kDynamic) {
        dims.insert(key);
      }
    }
  }
  return dims;
}

// Releases a held mu_ for the user's code and takes it back, also when that code throws (Note
// [No lock around user code]); tracing_ is set meanwhile.
class UnlockedForUserCode {
 public:
  UnlockedForUserCode(std::unique_lock<std::mutex>& lock, bool& tracing, std::condition_variable& done)
      : lock_(lock), tracing_(tracing), done_(done) {
    tracing_ = true;
    lock_.unlock();
  }
  ~UnlockedForUserCode() {
    lock_.lock();
    tracing_ = false;
    done_.notify_all();
  }

 private:
  std::unique_lock<std::mutex>& lock_;
  bool& tracing_;
  std::condition_variable& done_;
};

// Note [Owner's call count]: the first thread with a hazard record to call claims the owner's
// counter; every other call takes the locked add.
int64_t CompiledFunction::Impl::CountCallSlow(const runtime::hazard::ThreadRecord* me) {
  const runtime::hazard::ThreadRecord* none = nullptr;
  if (me != nullptr && owner_.load() == nullptr && owner_.compare_exchange_strong(none, me)) return CountCall();
  return other_calls_.fetch_add(1, std::memory_order_relaxed) + owner_calls_.load(std::memory_order_relaxed);
}

bool CompiledFunction::Impl::RunEntry(const CacheEntry& e, const std::vector<c10::IValue>& args,
                                      std::vector<at::Tensor>* outputs, std::string* failure) const {
  if (__builtin_expect(below_autograd_, 0)) {
    codegen::ScopedBelowAutograd below;
    return e.Run(args, outputs, failure);
  }
  return e.Run(args, outputs, failure);
}

std::vector<at::Tensor> CompiledFunction::Impl::Call(const std::vector<c10::IValue>& args) {
  const int64_t call_index = CountCall();
  if (tracer::IsTracing()) {
    // Called from inside another function's trace: run inline so the outer trace records the
    // ops (a nested cache would hide them).
    slow_calls_.fetch_add(1, std::memory_order_relaxed);
    eager_calls_.fetch_add(1, std::memory_order_relaxed);
    return fn_(args);
  }
  // Hot path. Budget: the entries' hit checks plus the artifact; no lock, no allocation before the
  // artifact runs.
  // Lookup hashes, per signature mask (usually one or two per function), only the properties on
  // which that mask's entries differ (none for a single entry), so its cost does not grow with the
  // number of entries; each candidate's HitCheck then enforces every guard of the entry.
  std::vector<std::pair<int, std::string>> value_failures;  // allocates only on a failure
  {
    // The snapshot, its entries and their artifacts stay alive while the reader holds it.
    const runtime::hazard::Reader<Snapshot> reader(snapshot_, overflow_readers_);
    for (const Snapshot::Group& group : reader.get()->groups) {
      const guards::SignatureIndex::Range candidates = group.index.Candidates(args.data(), args.size());
      for (const uint32_t* c = candidates.begin; c != candidates.end; ++c) {
        const CacheEntry* e = group.entries[*c];
        if (!e->hit.Check(args.data(), args.size()) || !e->modules.Check() || !e->Verified(args.data())) continue;
        std::vector<at::Tensor> outputs;
        std::string failure;
        if (RunEntry(*e, args, &outputs, &failure)) {
          if (e->modules.writes_flags()) e->modules.ApplyFlagWrites();
          // Per-entry hits are for explain() only: a plain increment (no locked instruction on the
          // hot path) that may undercount when threads hit the same entry at once.
          e->hits.store(e->hits.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
          e->last_used.store(call_index, std::memory_order_relaxed);
          return outputs;
        }
        value_failures.emplace_back(e->index, std::move(failure));
      }
    }
  }
  return Miss(args, call_index, {value_failures.begin(), value_failures.end()});
}

std::string CompiledFunction::Impl::WaitForTrace(std::unique_lock<std::mutex>& lock) {
  const auto start = std::chrono::steady_clock::now();
  while (tracing_) {
    const uint64_t ops = tracer::OpsSeen();
    if (traced_cv_.wait_for(lock, kTraceStall, [this] { return !tracing_; })) return "";
    if (tracer::OpsSeen() == ops) {
      return absl::StrCat("another thread's trace of this function recorded no op for ", kTraceStall.count(),
                          " ms (it may be waiting for this thread)");
    }
    if (std::chrono::steady_clock::now() - start >= kMaxWaitForTrace) {
      return absl::StrCat("another thread was still tracing this function after ", kMaxWaitForTrace.count() / 1000,
                          " s");
    }
  }
  return "";
}

std::vector<at::Tensor> CompiledFunction::Impl::Miss(const std::vector<c10::IValue>& args,
                                                     int64_t call_index,
                                                     const std::map<int, std::string>& value_failures) {
  slow_calls_.fetch_add(1, std::memory_order_relaxed);
  ValidateArgs(args, *this);
  std::unique_lock<std::mutex> lock(mu_);
  // Another thread is tracing (Note [No lock around user code]): wait for its entry while it makes
  // progress.
  std::string stalled = WaitForTrace(lock);
  // Another thread may have compiled this signature while we waited for the lock.
  const std::vector<std::string> names = ArgNames(args.size());
  std::map<int, std::string> failures = value_failures;
  for (const auto& e : snapshot_.load()->entries) {
    if (failures.count(e->index) || !e->program.Check(args) || !e->modules.Check() || !e->Verified(args.data())) {
      continue;
    }
    std::vector<at::Tensor> outputs;
    std::string failure;
    if (RunEntry(*e, args, &outputs, &failure)) {
      if (e->modules.writes_flags()) e->modules.ApplyFlagWrites();
      slow_hits_.fetch_add(1);
      e->hits.fetch_add(1);
      e->last_used.store(call_index);
      return outputs;
    }
    failures[e->index] = failure;
  }

  if (!eager_reason_.empty()) {
    lock.unlock();
    eager_calls_.fetch_add(1);
    return fn_(args);
  }

  const auto entries = EntriesMru();
  RecompileEvent event;
  event.call_index = call_index;
  std::string log = absl::StrCat("Recompiling function ", options_.name,
                                 "\n    triggered by the following guard failure(s):\n");
  std::string last_reason;
  for (const auto& e : entries) {
    auto it = failures.find(e->index);
    std::string reason = it != failures.end() ? it->second : e->program.FirstFailure(args, names);
    if (reason.empty()) reason = e->modules.FirstFailure();
    if (reason.empty() && e->verified != nullptr) reason = e->verified->Failure(args.data());
    if (reason.empty()) reason = "guards passed but the entry was not used";  // cannot happen
    absl::StrAppend(&log, "    - ", id_, "/", e->index, ": ", reason, "\n");
    if (last_reason.empty()) last_reason = absl::StrCat(id_, "/", e->index, ": ", reason);
    event.reasons.push_back(std::move(reason));
  }

  // Note [Verified size reads], step 3: an entry whose only failing check is its set of verified
  // read sizes re-traces instead of recompiling. One trace serves every such entry (most recently
  // used first): it is the call's result either way; if it is an instance of none of their graphs,
  // it is the trace the recompile below uses.
  std::optional<tracer::TraceResult> pretrace;
  std::optional<ModuleGuards> pre_modules;
  std::string verify_note;
  std::vector<std::shared_ptr<const CacheEntry>> candidates;
  for (const auto& e : entries) {
    if (e->verified == nullptr || failures.count(e->index) || !e->program.Check(args) || !e->modules.Check()) continue;
    candidates.push_back(e);
  }
  if (!tracing_ && !candidates.empty()) {
    ModuleGuards modules = ModuleGuards::Capture(watched_);
    const TraceClock::time_point start = TraceClock::now();
    tracer::TraceResult t;
    try {
      UnlockedForUserCode unlocked(lock, tracing_, traced_cv_);
      t = tracer::Trace(fn_, args, names);
      if (post_trace_) post_trace_(&t);
    } catch (...) {
      event.action = "retraced: the function raised an exception (no entry added)";
      if (logs_.recompiles) runtime::LogToStderr(log);
      RecordEvent(std::move(event));
      throw;
    }
    for (const auto& e : candidates) {
      const std::string mismatch = runtime::InstanceMismatch(*e->graph, e->reads, *e->shapes, t);
      const std::vector<int64_t> tuple = e->verified->TupleOf(*t.graph);
      const std::string tuple_text = e->verified->TupleText(tuple);
      if (mismatch.empty()) {
        e->verified->Add(tuple);
        verifications_.fetch_add(1);
        event.action = absl::StrCat("verified ", tuple_text, " against entry ", id_, "/", e->index, " (re-trace ",
                                    absl::StrFormat("%.2f", Millis(TraceClock::now() - start)), " ms, no compile)");
        if (logs_.recompiles) {
          runtime::LogToStderr(absl::StrCat("warden: function '", options_.name, "' ", event.action));
        }
        if (trace_ != nullptr) {
          TraceMiss(*this, "size_verified", event, entries, args, names, failures,
                    {{"entry", EntryId(*this, e->index)}});
        }
        RecordEvent(std::move(event));
        return t.outputs;
      }
      if (verify_note.empty()) {
        verify_note = absl::StrCat("re-traced for ", tuple_text, ", which entry ", id_, "/", e->index,
                                   " could not verify: ", mismatch);
        if (candidates.size() > 1) absl::StrAppend(&verify_note, " (nor ", candidates.size() - 1, " more)");
      }
    }
    pretrace = std::move(t);
    pre_modules = std::move(modules);
  }
  // The call already ran the user's function (a re-trace): its result stands when nothing compiles.
  auto eagerly = [&]() -> std::vector<at::Tensor> {
    lock.unlock();
    eager_calls_.fetch_add(1);
    if (pretrace && !pretrace->rerun_eagerly) return pretrace->outputs;
    return fn_(args);
  };

  const int limit = std::max(0, options_.cache_size_limit);
  if (static_cast<int>(entries.size()) >= limit) {
    std::string message = absl::StrCat("warden hit cache_size_limit (", limit, ")\n   function: '",
                                       options_.name, "'\n   last reason: ", last_reason,
                                       "\n   from now on: calls that match no entry run eagerly (stats().eager_calls)");
    if (!last_kept_static_.empty()) {
      absl::StrAppend(&message, "\n   dims that could not become dynamic: ", last_kept_static_,
                      "\n   to avoid: keep such sizes out of C++ code (x.flatten(1) or view({-1, n}) instead of "
                      "view({x.size(0), -1}); pass RNN states in), or raise cache_size_limit");
    } else {
      absl::StrAppend(&message, "\n   to avoid: mark_dynamic() the dims that vary, or raise cache_size_limit");
    }
    event.action = absl::StrCat("cache_size_limit (", limit, ") hit: ",
                                options_.fail_on_cache_limit ? "raised an error" : "ran eagerly");
    if (trace_ != nullptr) TraceMiss(*this, "cache_limit", event, entries, args, names, failures, {{"limit", limit}});
    RecordEvent(std::move(event));
    if (!limit_warned_) {
      limit_warned_ = true;
      runtime::LogToStderr(message);
    }
    if (options_.fail_on_cache_limit) throw Error(message);
    return eagerly();
  }

  // Note [No lock around user code]
  // The user's function runs (traced) without mu_: from inside its body it may call explain(),
  // recompiles(), guards(), reset() or mark_dynamic() on this function, which take mu_, or wait for
  // a thread that calls this function. While it runs, tracing_ is set (a call from inside the
  // trace itself runs inline: tracer::IsTracing()). A miss on another thread waits
  // for that trace while it makes progress (a server's threads arriving together then hit the entry
  // it makes, however slow the first trace of a big model is on a loaded machine). A trace that
  // records no op for kTraceStall is taken to be blocked, perhaps on this very thread: the miss
  // then runs the function eagerly instead of tracing it again, which is what breaks the cycle
  // when the traced body waits for a thread that calls the function (kMaxWaitForTrace bounds a
  // trace that progresses forever). The rest of a compile (guards, codegen, publishing) holds mu_,
  // so a miss that waited finds the entry: a signature is never compiled twice.
  if (tracing_) {
    event.action = absl::StrCat("ran eagerly: ", stalled, " (Note [No lock around user code])");
    if (logs_.recompiles) runtime::LogToStderr(absl::StrCat("warden: function '", options_.name, "' ", event.action));
    RecordEvent(std::move(event));
    return eagerly();
  }

  // Trace (runs the user's function once, eagerly). Exceptions reach the caller unchanged and
  // leave no entry behind.
  const TraceClock::time_point compile_start = TraceClock::now();
  if (trace_ != nullptr) {
    nlohmann::json j = TraceFields(*this, call_index);
    j["entries"] = entries.size();
    trace_->Emit("compile_start", std::move(j));
  }
  // Watched modules as the call found them (Note [Watched modules]: the entry's guards describe
  // the state at entry, and flags the function itself changes are replayed on hits).
  ModuleGuards modules = pre_modules ? std::move(*pre_modules) : ModuleGuards::Capture(watched_);
  tracer::TraceResult trace;
  try {
    if (pretrace) {
      trace = std::move(*pretrace);
    } else {
      UnlockedForUserCode unlocked(lock, tracing_, traced_cv_);
      trace = tracer::Trace(fn_, args, names);
      if (post_trace_) post_trace_(&trace);
    }
  } catch (...) {
    if (trace_ != nullptr) {
      nlohmann::json j = TraceFields(*this, call_index);
      j["error"] = CurrentExceptionText();
      trace_->Emit("trace_error", std::move(j));
    }
    if (!entries.empty()) {
      event.action = "retraced: the function raised an exception (no entry added)";
      if (logs_.recompiles) runtime::LogToStderr(log);
      RecordEvent(std::move(event));
    }
    throw;
  }
  const TraceClock::time_point traced_at = TraceClock::now();
  if (trace.untraceable.empty() && !modules.StructureHolds()) {
    // A hit could not repeat registering or replacing submodules (Note [Watched modules]); this
    // call's result is the trace's, which ran them.
    trace.untraceable = "the function registers or replaces submodules of a watched module";
  }
  if (!trace.untraceable.empty()) {
    eager_reason_ = trace.untraceable;
    eager_calls_.fetch_add(1);
    event.action = absl::StrCat("not traceable (", trace.untraceable, "): runs eagerly from now on");
    if (trace_ != nullptr) {
      TraceMiss(*this, "eager_fallback", event, entries, args, names, failures, {{"reason", trace.untraceable}});
    }
    if (logs_.recompiles || entries.empty()) {
      runtime::LogToStderr(absl::StrCat("warden: function '", options_.name, "' ", event.action));
    }
    RecordEvent(std::move(event));
    if (trace.rerun_eagerly) {
      modules.RestoreFlags();  // the re-run must start from the state the call found
      lock.unlock();
      return fn_(args);
    }
    return trace.outputs;
  }

  // Scalars the caller marked dynamic become graph inputs if a second trace confirms that they
  // are used only as op arguments (Note [Symbolic scalars]).
  std::set<int> scalar_candidates;
  for (const auto& [key, dynamic] : dim_hints_) {
    const int arg = key.first;
    if (dynamic && arg < static_cast<int>(args.size()) && (args[arg].isInt() || args[arg].isDouble()) &&
        !static_scalars_.count(arg)) {
      scalar_candidates.insert(arg);
    }
  }
  runtime::ScalarPromotion promotion;
  {
    UnlockedForUserCode unlocked(lock, tracing_, traced_cv_);  // a verification trace runs the function again
    promotion = runtime::PromoteScalars(fn_, args, names, trace, scalar_candidates);
  }
  trace.graph = promotion.graph;
  static_scalars_.insert(promotion.kept_args.begin(), promotion.kept_args.end());
  // Options::capture_scalar_outputs: item() results that only feed op arguments become graph values,
  // checked by a verification trace with another value (Note [Symbolic scalars]).
  runtime::ScalarCapture capture;
  if (options_.capture_scalar_outputs && promotion.promoted.empty()) {
    UnlockedForUserCode unlocked(lock, tracing_, traced_cv_);  // the check runs the function again
    capture = runtime::CaptureScalarOutputs(fn_, args, names, trace);
  }
  if (capture.graph != nullptr) trace.graph = capture.graph;

  auto entry = std::make_shared<CacheEntry>();
  entry->scalar_notes = promotion.kept;
  entry->scalar_notes.insert(entry->scalar_notes.end(), capture.captured.begin(), capture.captured.end());
  entry->scalar_notes.insert(entry->scalar_notes.end(), capture.kept.begin(), capture.kept.end());
  entry->index = next_entry_index_++;
  entry->created_at_call = call_index;
  entry->last_used.store(call_index);
  entry->graph = trace.graph;
  entry->reads = trace.reads;
  entry->rule_mismatches = trace.rule_mismatches;
  guards::BuildInput in{trace.graph.get(), &trace.reads, &args};
  std::set<std::pair<int, int>> newly_dynamic;
  const std::set<std::pair<int, int>> dynamic = DynamicDims(args, entries, &newly_dynamic);
  std::vector<std::string> names_now;  // dims and scalars that are symbolic for the first time
  // Dims automatic dynamic or mark_dynamic asked for that something kept static, with what did:
  // the recompile action says so (a new size of one of them is another recompile).
  std::vector<std::string> kept_static;
  if (!dynamic.empty()) {
    // Sizes C++ read stay symbolic if another entry's trace shows them to be the only difference
    // (Note [Verified size reads], steps 1 and 2); otherwise they specialize.
    ops::ShapePassResult shapes =
        ops::PropagateShapes(*trace.graph, trace.reads, dynamic,
                             /*verify_reads=*/promotion.promoted.empty() && capture.captured.empty());
    std::set<int> pending_reads;  // read sizes to be generalized on the next miss (no warning yet)
    if (!shapes.read_symbols.empty()) {
      std::string why;
      bool pending = false;
      entry->verified = GeneralizeReads(trace, entries, dynamic, names, &shapes, &why, &pending);
      if (pending) {
        for (const auto& [k, reader] : shapes.read_symbols) pending_reads.insert(k);
      }
      if (entry->verified != nullptr) {
        in.strides_verified = !shapes.stride_read.empty();  // trace.graph is the generalized graph
      } else {
        shapes = ops::PropagateShapes(*trace.graph, trace.reads, dynamic);
        if (!why.empty()) verify_note = absl::StrCat(verify_note.empty() ? "" : verify_note + "; ", why);
      }
    }
    // The entry's graph: the generalized one where reads were verified, with the op arguments C++
    // computed from symbolic sizes read at run time (Note [Symbolic sizes] in tracer/tracer.cc).
    trace.graph = ops::WithRunTimeSizes(trace.graph, shapes);
    entry->graph = trace.graph;
    in.graph = trace.graph.get();
    entry->shapes = std::make_shared<ops::ShapePassResult>(std::move(shapes));
    in.shapes = entry->shapes.get();
    for (size_t k = 0; k < entry->shapes->symbols.size(); ++k) {
      const ops::SymbolSource& src = entry->shapes->symbols[k];
      auto why = entry->shapes->specialized.find(static_cast<int>(k));
      if (why == entry->shapes->specialized.end()) {
        if (newly_dynamic.count({src.arg, src.dim})) names_now.push_back(ops::SymbolName(src, names));
        continue;
      }
      auto hint = dim_hints_.find({src.arg, src.dim});
      if (pending_reads.count(static_cast<int>(k))) continue;  // said by the note below
      if (auto_dynamic_.count({src.arg, src.dim}) || (hint != dim_hints_.end() && hint->second)) {
        kept_static.push_back(absl::StrCat(ops::SymbolName(src, names), " stays static: ", why->second));
      }
      if (hint != dim_hints_.end() && hint->second && warned_static_.insert({src.arg, src.dim}).second) {
        runtime::LogToStderr(absl::StrCat("warden: function '", options_.name, "': mark_dynamic(", src.arg, ", ",
                                          src.dim, ") is not honored: ", ops::SymbolName(src, names),
                                          " stays static (", why->second, ")"));
      }
    }
  }
  for (int arg : promotion.promoted) names_now.push_back(names[arg]);
  std::string became_dynamic;
  if (!names_now.empty()) became_dynamic = absl::StrCat(" with ", absl::StrJoin(names_now, ", "), " dynamic");
  if (!kept_static.empty()) {
    absl::StrAppend(&became_dynamic, "; ", absl::StrJoin(kept_static, "; "));
    last_kept_static_ = absl::StrJoin(kept_static, "; ");
  }
  if (entry->verified != nullptr) {
    absl::StrAppend(&became_dynamic, "; ", absl::StrJoin(entry->verified->names(), ", "),
                    " read by C++: verified per value by re-tracing (no recompile for a new value)");
  }
  if (!verify_note.empty()) absl::StrAppend(&became_dynamic, "; ", verify_note);
  entry->program = guards::GuardProgram(guards::BuildGuards(in));
  modules.RecordFlagsAfterCall();
  {
    // The tensors the graph captured are those the entry's captured-tensor guards hold.
    std::vector<const c10::TensorImpl*> captured;
    for (const guards::Guard& g : entry->program.guards()) {
      if (g.kind == guards::GuardKind::kCapturedTensor) captured.push_back(g.captured->tensor.unsafeGetTensorImpl());
    }
    std::sort(captured.begin(), captured.end());
    modules.KeepBoundTensorsIn(captured);
  }
  entry->modules = std::move(modules);
  WarnUnwatchedModes(*trace.graph);
  entry->signature = guards::SignatureOf(entry->program.guards());
  entry->hit = guards::HitCheck(entry->program.guards());

  const TraceClock::time_point guarded_at = TraceClock::now();
  const codegen::KernelCacheStats kernels_before = codegen::GetKernelCacheStats();
  try {
    CompileEntry(entry, names);
  } catch (const std::exception& e) {
    if (trace_ != nullptr) {
      nlohmann::json j = TraceFields(*this, call_index);
      j["backend"] = options_.backend;
      j["error"] = e.what();
      trace_->Emit("backend_error", std::move(j));
    }
    throw;
  }
  compiles_.fetch_add(1);
  if (trace_ != nullptr) {
    const TraceClock::time_point compiled_at = TraceClock::now();
    nlohmann::json ms = {{"trace", Millis(traced_at - compile_start)}, {"guards", Millis(guarded_at - traced_at)},
                         {"backend", Millis(compiled_at - guarded_at)}, {"total", Millis(compiled_at - compile_start)}};
    TraceCompiled(*this, *entry, args, names, absl::StrCat(entries.empty() ? "compiled" : "recompiled", became_dynamic),
                  std::move(ms), kernels_before);
  }

  if (logs_.graph) {
    runtime::LogToStderr(absl::StrCat("warden: graph of ", options_.name, " entry ", id_, "/",
                                      entry->index, ":\n", GraphText(*entry)));
  }
  if (logs_.guards) {
    runtime::LogToStderr(absl::StrCat("warden: guards of ", options_.name, " entry ", id_, "/",
                                      entry->index, ":\n  ", absl::StrJoin(GuardLines(*entry, names), "\n  ")));
  }
  if (!entries.empty()) {
    event.action = absl::StrCat("recompiled", became_dynamic);
    if (logs_.recompiles) runtime::LogToStderr(log);
    if (trace_ != nullptr) {
      TraceMiss(*this, "recompile", event, entries, args, names, failures, {{"entry", EntryId(*this, entry->index)}});
    }
    RecordEvent(std::move(event));
  }

  std::vector<std::shared_ptr<const CacheEntry>> next;
  next.push_back(entry);
  for (const auto& e : snapshot_.load()->entries) next.push_back(e);
  Publish(std::move(next));
  return trace.outputs;
}

// Note [Background compile]
// With Options::async_compile the miss that creates an entry returns the traced (eager) result at
// once and publishes the entry with a replay ("aten") artifact; a job on the process's compile pool
// (Note [Compile pool]) compiles the real one and installs it with one atomic pointer store (ArtifactSlot). Calls before
// that replay the graph, calls after run the kernel; both compute what eager does, so a call never
// sees a half-switched state. The job touches only the entry (kept alive by its shared_ptr) and
// process-wide logging, never the function's state; ~Impl drops queued jobs and waits for running
// ones.
void CompiledFunction::Impl::CompileEntry(const std::shared_ptr<CacheEntry>& entry,
                                          const std::vector<std::string>& names) {
  const CompileContext context = ContextOf(*entry, options_, logs_);
  const std::string where = absl::StrCat(options_.name, " entry ", id_, "/", entry->index);
  entry->backward = runtime::CompiledBackward::Make(fn_, *entry->graph, options_, &entry->backward_note);
  // Background compile: replay now, the real artifact once it is built (Note [Background compile]).
  const bool background = options_.async_compile && options_.backend != "aten";
  // Note [Compiled backward]: the forward artifact also returns the outputs the backward saves.
  const std::shared_ptr<const tracer::Graph> graph =
      entry->backward != nullptr && entry->backward->forward_graph() != nullptr ? entry->backward->forward_graph()
                                                                                : entry->graph;
  auto compiled = CompileWithFallback(background ? "aten" : options_.backend, graph, context, id_, where);
  if (!compiled.ok()) {
    throw Error(absl::StrCat("warden: function '", options_.name,
                             "': could not compile the traced graph: ", compiled.status().message()));
  }
  if (!background) {
    entry->artifact.Install(std::move(compiled->artifact), compiled->backend, compiled->note);
    return;
  }
  entry->artifact.Install(std::move(compiled->artifact), "aten",
                          absl::StrCat("compiling with '", options_.backend,
                                       "' in the background; replaying with 'aten' until it is ready"));
  // The trace log is process-wide and never freed, so the job may write to it after ~Impl began.
  runtime::TraceLog* trace = trace_;
  nlohmann::json trace_fields = trace != nullptr ? TraceFields(*this, entry->created_at_call) : nlohmann::json();
  if (trace != nullptr) trace_fields["entry"] = EntryId(*this, entry->index);
  runtime::CompilePool::Get().Submit(jobs_, [entry, graph, backend = options_.backend, context, id = id_, where,
                                             trace, trace_fields] {
    const TraceClock::time_point start = TraceClock::now();
    std::string error;
    try {
      auto compiled = CompileWithFallback(backend, graph, context, id, where);
      if (compiled.ok()) {
        entry->artifact.Install(std::move(compiled->artifact), compiled->backend, compiled->note);
      } else {
        error = std::string(compiled.status().message());
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!error.empty()) {
      entry->artifact.SetNote(absl::StrCat("background compile with '", backend, "' failed (", error,
                                           "); replaying with 'aten'"));
    }
    if (trace != nullptr) {
      nlohmann::json j = trace_fields;
      j["backend"] = entry->artifact.backend();
      j["note"] = entry->artifact.note();
      j["ms"] = Millis(TraceClock::now() - start);
      if (!error.empty()) j["error"] = error;
      trace->Emit("background_compile_end", std::move(j));
    }
  });
}

std::vector<std::string> GuardLines(const CacheEntry& e, const std::vector<std::string>& names) {
  std::vector<std::string> lines;
  for (const guards::Guard& g : e.program.guards()) {
    lines.push_back(absl::StrCat(guards::Describe(g, names), "  # ", g.provenance));
  }
  for (std::string& line : e.modules.Describe()) lines.push_back(std::move(line));
  return lines;
}

std::string UnwatchedModeHint(const tracer::Graph& g) {
  if (g.mode_dependent.empty()) return "";
  return absl::StrCat(g.mode_dependent.front(), g.mode_dependent.size() > 1 ? absl::StrCat(" and ", g.mode_dependent.size() - 1, " more") : "",
                      " took its train/eval flag from C++ state the trace cannot see; if it comes from a "
                      "module's train()/eval(), call watch(module) on the compiled function so that a mode "
                      "switch recompiles instead of replaying the other mode's graph");
}

// Note [Watched modules]: without watch(), a graph holding a mode-dependent op is valid only while
// the module keeps its mode; say so once per function.
void CompiledFunction::Impl::WarnUnwatchedModes(const tracer::Graph& g) {
  if (!watched_.empty() || mode_warned_ || g.mode_dependent.empty()) return;
  mode_warned_ = true;
  runtime::LogToStderr(absl::StrCat("warden: function '", options_.name, "': ", UnwatchedModeHint(g)));
}

// --- Public API --------------------------------------------------------------------------------

CompiledFunction compile(Fn fn, Options options) {
  if (!fn) throw Error("warden::compile: fn is empty");
  if (options.cache_size_limit < 0) {
    throw Error(absl::StrCat("warden::compile: options.cache_size_limit must be >= 0, got ",
                             options.cache_size_limit));
  }
  if (MakeBackend(options.backend) == nullptr) {
    throw Error(absl::StrCat("warden::compile: unknown backend '", options.backend,
                             "' (registered: ", absl::StrJoin(BackendNames(), ", "), ")"));
  }
  // Names reach stderr, explain() and the trace log: control characters are escaped, so a name
  // cannot forge log lines or terminal escapes.
  options.name = runtime::EscapeControl(options.name);
  for (std::string& n : options.arg_names) n = runtime::EscapeControl(n);
  const int id = next_function_id.fetch_add(1);
  // Without a name of its own, a function is told apart from the others by its id (the cache
  // limit warning, logs, the trace log and `warden report` all show it).
  if (options.name == Options().name) options.name = absl::StrCat(options.name, "#", id);
  return CompiledFunction(std::make_shared<CompiledFunction::Impl>(std::move(fn), std::move(options), id));
}

std::vector<at::Tensor> CompiledFunction::operator()(const std::vector<c10::IValue>& args) {
  return impl_->Call(args);
}

CompiledFunction& CompiledFunction::mark_dynamic(int arg, int dim) {
  if (arg < 0 || dim < 0) {
    throw Error(absl::StrCat("warden: mark_dynamic(", arg, ", ", dim,
                             "): arg and dim must be non-negative"));
  }
  std::lock_guard<std::mutex> lock(impl_->mu_);
  impl_->dim_hints_[{arg, dim}] = true;
  return *this;
}

CompiledFunction& CompiledFunction::watch(const torch::nn::Module& module, std::string name) {
  WatchedModule w = MakeWatched(module, std::move(name));
  std::lock_guard<std::mutex> lock(impl_->mu_);
  bool replaced = false;
  for (WatchedModule& existing : impl_->watched_) {
    if (existing.module == w.module) {
      existing.name = w.name;
      replaced = true;
    }
  }
  if (!replaced) impl_->watched_.push_back(std::move(w));
  impl_->Publish({});  // existing entries were compiled without these guards
  return *this;
}

CompiledFunction& CompiledFunction::mark_static(int arg, int dim) {
  if (arg < 0 || dim < 0) {
    throw Error(absl::StrCat("warden: mark_static(", arg, ", ", dim,
                             "): arg and dim must be non-negative"));
  }
  std::lock_guard<std::mutex> lock(impl_->mu_);
  impl_->dim_hints_[{arg, dim}] = false;
  return *this;
}

Stats CompiledFunction::stats() const {
  Stats s;
  s.calls = impl_->Calls();
  s.cache_hits = impl_->Hits();
  s.compiles = impl_->compiles_.load();
  s.eager_calls = impl_->eager_calls_.load();
  s.size_verifications = impl_->verifications_.load();
  return s;
}

std::vector<RecompileEvent> CompiledFunction::recompiles() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return impl_->events_;
}

std::vector<std::string> CompiledFunction::guards(int entry) const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  for (const auto& e : impl_->snapshot_.load()->entries) {
    if (e->index == entry) {
      return GuardLines(*e, impl_->ArgNames(e->graph->arg_kinds.size()));
    }
  }
  throw Error(absl::StrCat("warden: guards(", entry, "): function '", impl_->options_.name,
                           "' has no cache entry ", entry, " (it has ",
                           impl_->snapshot_.load()->entries.size(), ")"));
}

void CompiledFunction::reset() {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  impl_->Publish({});
  impl_->events_.clear();
  impl_->dropped_events_ = 0;
  impl_->next_entry_index_ = 0;
  impl_->eager_reason_.clear();
  impl_->limit_warned_ = false;
  impl_->auto_dynamic_.clear();
  impl_->profile_checked_ = false;
  impl_->profile_note_.clear();
  impl_->static_scalars_.clear();
}

}  // namespace warden
