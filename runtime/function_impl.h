// Internal state of a CompiledFunction: cache entries, the immutable snapshot the hot path reads,
// events and stats. Shared by compiled_function.cc (calls, compiles) and explain.cc (reports).
#ifndef WARDEN_RUNTIME_FUNCTION_IMPL_H_
#define WARDEN_RUNTIME_FUNCTION_IMPL_H_

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "guards/evaluator.h"
#include "guards/signature.h"
#include "ops/shape_pass.h"
#include "runtime/backend.h"
#include "runtime/compile_pool.h"
#include "runtime/compiled_backward.h"
#include "runtime/hazard.h"
#include "runtime/logging.h"
#include "runtime/trace_log.h"
#include "runtime/verified_sizes.h"
#include "runtime/warden.h"
#include "runtime/watch.h"
#include "tracer/graph.h"

namespace warden {

// The artifact an entry runs, and which backend made it. Set once before the entry is published;
// with Options::async_compile a background compile installs the final artifact later. The hot path
// takes no lock: it loads the active pointer. Replaced artifacts live as long as the entry, since a
// concurrent call may still be running one.
class ArtifactSlot {
 public:
  const Artifact* operator->() const { return active_.load(std::memory_order_acquire); }
  const Artifact* get() const { return active_.load(std::memory_order_acquire); }

  // Makes `artifact` (compiled by `backend`; `note` says why that is not the backend asked for,
  // or that a better one is being compiled) the one calls run from now on.
  void Install(std::unique_ptr<Artifact> artifact, std::string backend, std::string note) const {
    std::lock_guard<std::mutex> lock(mu_);
    active_.store(artifact.get(), std::memory_order_release);
    owned_.push_back(std::move(artifact));
    backend_ = std::move(backend);
    note_ = std::move(note);
  }
  std::string backend() const {
    std::lock_guard<std::mutex> lock(mu_);
    return backend_;
  }
  std::string note() const {
    std::lock_guard<std::mutex> lock(mu_);
    return note_;
  }
  void SetNote(std::string note) const {
    std::lock_guard<std::mutex> lock(mu_);
    note_ = std::move(note);
  }

 private:
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<Artifact>> owned_;
  mutable std::string backend_, note_;
  mutable std::atomic<const Artifact*> active_{nullptr};
};

struct CacheEntry {
  int index = 0;                    // E in "F/E": creation order within the function
  int64_t created_at_call = 0;
  guards::GuardProgram program;    // every guard: the miss path and the verbose reasons
  guards::Signature signature;     // exact-match part, hashed for lookup
  guards::HitCheck hit;            // every guard, compiled for the hit path
  ModuleGuards modules;            // watched modules' state (Note [Watched modules])
  std::shared_ptr<const tracer::Graph> graph;
  ArtifactSlot artifact;
  // Note [Compiled backward]: set when the outputs require grad and the backward is compiled;
  // backward_note says why not where they require grad and it is not.
  std::shared_ptr<runtime::CompiledBackward> backward;
  std::string backward_note;
  bool Run(const std::vector<c10::IValue>& args, std::vector<at::Tensor>* outputs, std::string* failure) const {
    return backward != nullptr ? backward->Run(*artifact.get(), args, outputs, failure)
                               : artifact->Run(args, outputs, failure);
  }
  std::vector<std::string> rule_mismatches;
  std::vector<std::string> scalar_notes;  // marked-dynamic scalars kept specialized, and why
  std::shared_ptr<const ops::ShapePassResult> shapes;  // null: every used size is static
  std::vector<tracer::MetadataRead> reads;              // of the trace the graph came from
  // Sizes C++ code read that this entry verifies per value (Note [Verified size reads]); null
  // when the graph depends on no read size.
  std::shared_ptr<runtime::VerifiedSizes> verified;
  bool Verified(const c10::IValue* args) const { return verified == nullptr || verified->Check(args); }
  mutable std::atomic<int64_t> last_used{0};  // call index of the last hit (MRU order)
  mutable std::atomic<int64_t> hits{0};
};

// What the hot path reads: never modified after publication. A replaced snapshot is retired and
// freed once no reader holds it (Note [Reclaiming snapshots] in runtime/hazard.h); entries it alone
// held go with it.
struct Snapshot {
  std::vector<std::shared_ptr<const CacheEntry>> entries;  // newest first

  // Entries grouped by signature mask; within a group, found by the signature values on which
  // they differ (guards::SignatureIndex) and confirmed by their HitCheck.
  struct Group {
    std::vector<guards::Probe> mask;
    std::vector<const CacheEntry*> entries;   // newest first
    guards::SignatureIndex index;             // candidates: positions in `entries`
  };
  std::vector<Group> groups;
};

class CompiledFunction::Impl {
 public:
  Impl(Fn fn, Options options, int id);
  ~Impl();

  std::vector<at::Tensor> Call(const std::vector<c10::IValue>& args);

  // Everything below is for explain/stats; all take mu_.
  Fn fn_;
  Options options_;
  int id_;
  runtime::LogTopics logs_;
  runtime::TraceLog* trace_;  // WARDEN_TRACE_DIR at compile(); null: no trace (Note [Trace events])

  std::atomic<const Snapshot*> snapshot_{nullptr};
  std::atomic<int> overflow_readers_{0};  // hot-path readers without a hazard slot (hazard.h)
  // Cache hits are derived, so that a hit pays one count (CountCall), not two: every call that
  // leaves the hot path (Miss, or a call from inside another trace) counts in slow_calls_, and a
  // Miss that finds an entry another thread just compiled counts in slow_hits_. Exact once calls
  // have returned; while others are in flight, approximate like the other counters (slow_calls_
  // is read before the call counts, which every slow call incremented first, so it is never negative).
  std::atomic<int64_t> slow_calls_{0}, slow_hits_{0}, compiles_{0}, eager_calls_{0}, verifications_{0};
  int64_t Hits() const {
    const int64_t slow = slow_calls_.load();
    return std::max<int64_t>(0, Calls() - slow + slow_hits_.load());
  }

  // Note [Owner's call count]
  // Every call is counted, and the count is the call's index (events, MRU order). A locked add
  // costs ~20 cycles and fences the hit that follows, so the thread that calls the function
  // first (by its hazard record, runtime/hazard.h) owns a counter only it writes, with a plain
  // load and store; other threads add to a shared counter with a locked add, as every call did
  // before. The total is the sum: exact once calls have returned (a record passes to a new
  // thread only after its old one ended, with release/acquire), approximate while others are in
  // flight, like the other counters.
  int64_t CountCall() {
    const runtime::hazard::ThreadRecord* me = runtime::hazard::tls_record;
    if (__builtin_expect(me != nullptr && me == owner_.load(std::memory_order_relaxed), 1)) {
      const int64_t mine = owner_calls_.load(std::memory_order_relaxed);
      owner_calls_.store(mine + 1, std::memory_order_relaxed);
      return mine + other_calls_.load(std::memory_order_relaxed);
    }
    return CountCallSlow(me);
  }
  int64_t CountCallSlow(const runtime::hazard::ThreadRecord* me);
  int64_t Calls() const { return owner_calls_.load() + other_calls_.load(); }
  std::atomic<const runtime::hazard::ThreadRecord*> owner_{nullptr};
  alignas(64) std::atomic<int64_t> owner_calls_{0};  // written by owner_'s thread only
  alignas(64) std::atomic<int64_t> other_calls_{0};

  mutable std::mutex mu_;  // guards everything below; held during a compile except while user code runs
  std::unique_ptr<Snapshot> current_;                 // what snapshot_ points to
  std::vector<std::unique_ptr<Snapshot>> retired_;    // replaced, possibly still being read
  std::vector<RecompileEvent> events_;
  int64_t dropped_events_ = 0;
  int next_entry_index_ = 0;
  std::string eager_reason_;        // non-empty: the function is not traceable, always eager
  bool limit_warned_ = false;
  std::map<std::pair<int, int>, bool> dim_hints_;  // (arg, dim) -> dynamic?
  std::set<std::pair<int, int>> auto_dynamic_;     // kAuto: dims that changed between calls
  bool profile_checked_ = false;                   // Note [Dynamism profiles]: read once per start
  std::string profile_note_;                       // what the profile did, for explain
  std::set<std::pair<int, int>> warned_static_;    // mark_dynamic dims already warned about
  std::string last_kept_static_;  // the latest compile's "argN.size(d) stays static: why" texts
  std::set<int> static_scalars_;                   // marked scalars a compile kept specialized
  // async_compile jobs (Note [Compile pool]); ~Impl cancels the queued ones and waits for the rest.
  std::shared_ptr<runtime::CompilePool::Group> jobs_ = std::make_shared<runtime::CompilePool::Group>();
  std::vector<WatchedModule> watched_;             // watch(): guarded by every later entry
  // Runs on every trace this function takes for an entry, before anything reads it (the compiled
  // backward substitutes the forward's saved outputs: Note [Compiled backward]). Set once, before
  // the first call.
  std::function<void(tracer::TraceResult*)> post_trace_;
  // Note [Below autograd]: set for a compiled backward's backward function; its artifacts run
  // under codegen::ScopedBelowAutograd (RunEntry).
  bool below_autograd_ = false;
  bool RunEntry(const CacheEntry& e, const std::vector<c10::IValue>& args, std::vector<at::Tensor>* outputs,
                std::string* failure) const;
  bool mode_warned_ = false;                       // the unwatched-mode-flag warning was given
  bool tracing_ = false;  // a miss runs the user's function with mu_ released (Note [No lock around user code])
  std::condition_variable traced_cv_;  // notified when tracing_ turns false
  // A miss waits for another thread's trace while that trace makes progress (records ops), giving
  // up after kTraceStall without progress or kMaxWaitForTrace in all (Note [No lock around user code]).
  static constexpr std::chrono::milliseconds kTraceStall{1000};
  static constexpr std::chrono::milliseconds kMaxWaitForTrace{60000};
  // Waits as above; returns the event text of a call that must run eagerly, empty if the trace ended.
  std::string WaitForTrace(std::unique_lock<std::mutex>& lock);

  std::string ArgName(size_t i) const;
  std::vector<std::string> ArgNames(size_t n) const;
  std::vector<std::shared_ptr<const CacheEntry>> EntriesMru() const;  // requires mu_
  void Publish(std::vector<std::shared_ptr<const CacheEntry>> entries);  // requires mu_

 private:
  std::vector<at::Tensor> Miss(const std::vector<c10::IValue>& args, int64_t call_index,
                               const std::map<int, std::string>& value_failures);
  void RecordEvent(RecompileEvent event);                                // requires mu_
  void WarnUnwatchedModes(const tracer::Graph& g);                       // requires mu_
  // Compiles the entry's artifact with Options.backend (falling back to "aten"), or, with
  // async_compile, installs a replay artifact now and starts the real compile. Requires mu_.
  void CompileEntry(const std::shared_ptr<CacheEntry>& entry, const std::vector<std::string>& names);
  // The (arg, dim) pairs to make symbolic in the next compile: automatic dynamic (kAuto),
  // every dim (kDynamic), then mark_dynamic / mark_static hints. Requires mu_.
  std::set<std::pair<int, int>> DynamicDims(const std::vector<c10::IValue>& args,
                                            const std::vector<std::shared_ptr<const CacheEntry>>& entries,
                                            std::set<std::pair<int, int>>* newly_dynamic);
};

// Internal access to a CompiledFunction's Impl (runtime code only).
struct ImplAccess {
  static CompiledFunction::Impl& Of(CompiledFunction& f) { return *f.impl_; }
};

// The entry's graph, with symbolic shapes (s0, s0*s1, ...) where it has any.
std::string GraphText(const CacheEntry& e);

// Why a graph with mode-dependent ops needs watch(module), or "" (Note [Watched modules]).
std::string UnwatchedModeHint(const tracer::Graph& g);

// Rendering of one entry's guards: "arg0.size(0) == 3  # used by aten::add.Tensor at %0 ...".
std::vector<std::string> GuardLines(const CacheEntry& e, const std::vector<std::string>& names);

constexpr size_t kMaxEvents = 1024;  // recompiles() keeps the most recent ones

}  // namespace warden

#endif  // WARDEN_RUNTIME_FUNCTION_IMPL_H_
