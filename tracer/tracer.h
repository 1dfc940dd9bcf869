// Capture of unmodified LibTorch code at the dispatcher. Trace() runs the user's function once,
// eagerly, on wrapper tensors that carry the DeferredInit functionality key; one boxed fallback on
// that key records every ATen op into a Graph and runs it on the real tensors. See Note [Capture].
// This file knows nothing about guards, caches or backends.
#ifndef WARDEN_TRACER_TRACER_H_
#define WARDEN_TRACER_TRACER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tracer/graph.h"

namespace warden::tracer {

// A read of tensor metadata made by code other than Warden's: user code, or a composite kernel
// that the tracer decomposed. Each one means the graph was specialized on that property.
struct MetadataRead {
  // kRank: dim() only (the rank is guarded for every used tensor anyway); kSizes: sizes(),
  // numel() (dim == -1) or size(d) (dim == d); kStrides: strides, contiguity, storage offset.
  enum class What : uint8_t { kSizes, kStrides, kRank };
  ValueId value = kNoValue;
  What what = What::kSizes;
  int dim = -1;  // kSizes: the one dim read, or -1 for all of them
  std::string by;  // "user code" or "aten::matmul (composite)"
};

struct TraceResult {
  std::shared_ptr<Graph> graph;
  std::vector<at::Tensor> outputs;    // the eager results of this call (real tensors)
  std::vector<MetadataRead> reads;    // deduplicated per (value, what, dim)
  // Non-empty: replaying the graph would not be sound (for example a data-dependent read after
  // a side effect); the reason says why and the function should run eagerly.
  std::string untraceable;
  // The function stopped (raw data access) before it returned: `outputs` is empty and the caller
  // must run it eagerly itself. Only set when nothing observable (a write to an argument or a
  // captured tensor) had happened, so the re-run sees the same inputs.
  bool rerun_eagerly = false;
  // Ops whose registered shape rule disagreed with ATen (recorded as opaque instead).
  std::vector<std::string> rule_mismatches;
};

using TracedFn = std::function<std::vector<at::Tensor>(const std::vector<c10::IValue>&)>;

// Runs `fn(args)` once under the tracer. Exceptions thrown by `fn` (or by ATen inside it) propagate
// unchanged. Arguments must be tensors (possibly undefined), ints, doubles or bools.
// `verification`: a second trace made only to compare graphs (Note [Symbolic scalars]); it must
// leave no trace of itself, so an op that would write an argument or a captured tensor, or draw a
// random number, abandons it before running (rerun_eagerly is then set; nothing was written).
// `scalar_overrides` (verification traces only): node index -> the value a data-dependent scalar
// op (item()) at that index returns to the function instead of its real result, and records.
TraceResult Trace(const TracedFn& fn, const std::vector<c10::IValue>& args,
                  const std::vector<std::string>& arg_names, bool verification = false,
                  const std::map<int, c10::IValue>* scalar_overrides = nullptr);

// True while the calling thread is inside Trace() (nested compiled functions run eagerly).
bool IsTracing();

// How many ops every trace in the process has seen so far: a thread waiting for another thread's
// trace tells a trace that progresses from one that is blocked (Note [No lock around user code]).
uint64_t OpsSeen();

}  // namespace warden::tracer

#endif  // WARDEN_TRACER_TRACER_H_
