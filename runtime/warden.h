// Warden's public C++ API (the contract of ../shared/API.md): compile() wraps ordinary LibTorch
// code into a CompiledFunction that traces it once per guard signature and replays the cached
// artifact afterwards. Everything outside this header (and runtime/backend.h for host-provided
// backends) is internal.
#ifndef WARDEN_RUNTIME_WARDEN_H_
#define WARDEN_RUNTIME_WARDEN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "tracer/error.h"

namespace torch::nn {
class Module;  // <torch/nn/module.h>; only CompiledFunction::watch takes one
}  // namespace torch::nn

namespace warden {

// How shapes are treated, like torch.compile's dynamic=False / None / True.
enum class Dynamic {
  kStatic,   // every size is specialized; a new size is a new cache entry
  kAuto,     // default: first compile static; a dim that changed becomes symbolic on recompile
  kDynamic,  // every dim symbolic from the first compile (sizes 0 and 1 still specialize)
};

struct Options {
  std::string name = "fn";                // used in logs, reports and file names
  std::string backend = "cpp";            // "aten": replay recorded ATen calls; "cpp": fused C++ kernels
  Dynamic dynamic = Dynamic::kAuto;
  int cache_size_limit = 8;               // entries per function; past it calls run eagerly
  bool fail_on_cache_limit = false;       // throw instead of running eagerly
  std::vector<std::string> arg_names;     // names used in reasons; default "arg0", "arg1", ...
  bool async_compile = false;             // compile kernels in the background; until one is
                                          // ready its entry replays the graph ("aten")
  bool capture_scalar_outputs = false;    // like Dynamo's flag: an item() whose value flows only
                                          // into op arguments stays a graph value (no value guard,
                                          // no recompile when it changes); setting it is the
                                          // user's promise that C++ does not branch on the value
};

// The traced function: ordinary LibTorch code. Arguments are tensors, ints, doubles or bools.
using Fn = std::function<std::vector<at::Tensor>(const std::vector<c10::IValue>& args)>;

struct Stats {
  int64_t calls = 0;          // every call
  int64_t cache_hits = 0;     // calls served by a cached entry
  int64_t compiles = 0;       // cache entries created (the first compile counts)
  int64_t eager_calls = 0;    // calls run eagerly (cache limit hit, or not traceable)
  int64_t size_verifications = 0;  // calls that re-traced to verify a new value of a size C++
                                   // code reads, for an existing entry: no compile (README
                                   // "Sizes your code reads"); calls = hits + compiles + eager
                                   // calls + these (+ calls that raised)
};

struct RecompileEvent {
  int64_t call_index;                   // 0-based index of the call that missed
  std::vector<std::string> reasons;     // one per existing cache entry, most recently used first
  std::string action;                   // what Warden did, e.g. "recompiled", "recompiled with
                                        // arg0.size(0) dynamic", "cache_size_limit (8) hit: ran eagerly"
};

struct ImplAccess;  // internal (runtime/function_impl.h)

class CompiledFunction {
 public:
  std::vector<at::Tensor> operator()(const std::vector<c10::IValue>& args);

  // Hints that apply to later compiles, like torch._dynamo.mark_dynamic / mark_static.
  CompiledFunction& mark_dynamic(int arg, int dim);
  CompiledFunction& mark_static(int arg, int dim);

  // Guards C++ state of a LibTorch module that no trace can see: the training flag of the module
  // and of every submodule, and which tensors its parameters and buffers are bound to. Applies to
  // every later compile; existing entries are dropped. `name` prefixes the reason texts.
  // The function keeps the module alive (it must be owned by a std::shared_ptr, as every
  // torch::nn::ModuleHolder's module is).
  CompiledFunction& watch(const torch::nn::Module& module, std::string name = "module");

  Stats stats() const;
  std::vector<RecompileEvent> recompiles() const;   // in call order
  std::vector<std::string> guards(int entry) const; // human-readable guards of one cache entry
  std::string explain() const;                      // graphs, guards with provenance, entries, events
  std::string explain_json() const;                 // the same, as one JSON document
  void reset();                                     // drop all entries and events

  class Impl;

 private:
  friend CompiledFunction compile(Fn fn, Options options);
  friend struct ImplAccess;
  explicit CompiledFunction(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;  // copies of a CompiledFunction share one cache
};

CompiledFunction compile(Fn fn, Options options = {});

}  // namespace warden

#endif  // WARDEN_RUNTIME_WARDEN_H_
