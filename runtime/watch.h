// CompiledFunction::watch: the C++ state of LibTorch modules that no trace can see (training flags,
// which submodules are registered where), captured per cache entry and checked on the hit path
// (Note [Watched modules]). The only runtime file that
// includes <torch/nn/module.h>.
#ifndef WARDEN_RUNTIME_WATCH_H_
#define WARDEN_RUNTIME_WATCH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/warden.h"

namespace warden {

struct WatchedModule {
  std::shared_ptr<const torch::nn::Module> module;
  std::string name;
};

// Keeps `module` alive: its shared_ptr (every ModuleHolder's module has one), else an error naming
// the problem (a module on the stack could die before the function).
WatchedModule MakeWatched(const torch::nn::Module& module, std::string name);

class ModuleGuards {
 public:
  ModuleGuards() = default;
  // The current state of every module of `watched` and of all their submodules.
  static ModuleGuards Capture(const std::vector<WatchedModule>& watched);

  // Hot path. Budget: one load and compare per submodule flag, per bound tensor member and per
  // child of a container (~1 ns each); no allocation, lock, throw or virtual call.
  bool Check() const noexcept { return empty_ || CheckAll(); }

  // A watched flag the traced call changed (`model->eval()` inside the function) is part of what
  // the call does: RecordFlagsAfterCall notes the flags the call left, and every hit of the entry
  // sets them again (ApplyFlagWrites, after the artifact ran), as eager would.
  void RecordFlagsAfterCall();
  bool writes_flags() const { return !flag_writes_.empty(); }
  void ApplyFlagWrites() const noexcept;
  // Puts the flags back as captured (before an eager re-run of an abandoned trace).
  void RestoreFlags() const noexcept;
  // False if a child registry changed since Capture (the call registered or replaced submodules).
  bool StructureHolds() const noexcept;

  // Keeps the bound-tensor guards of members whose tensor the entry's graph captured (`captured`,
  // sorted) or that are undefined (an absent bias a rebinding would bring in); the graph cannot
  // depend on the others. Note [Watched modules].
  void KeepBoundTensorsIn(const std::vector<const c10::TensorImpl*>& captured);

  // Slow path: the reason of ../shared/API.md for the first failing guard, "" if all hold.
  std::string FirstFailure() const;
  // One line per guard, for guards(entry) and explain().
  std::vector<std::string> Describe() const;
  bool empty() const { return empty_; }
  size_t num_modules() const { return flags_.size(); }

 private:
  bool CheckAll() const noexcept;

  // The child registry of a container module: its items vector must still start where it did and
  // hold as many items (nothing registered, removed or reallocated), each the same submodule
  // (replace_module rebinds one in place): expected_[first, first + size).
  struct Children {
    const void* items;  // the std::vector of the children OrderedDict's items
    const void* begin;  // its data() at capture
    size_t size;
    size_t first;
    int root;            // into paths_: the watched module's name
    std::string prefix;  // "layer1." : the container's path below the root
  };

  bool empty_ = true;
  // One entry per module (the watched ones and all their submodules), in three dense arrays so
  // that the hot path streams through pointers and expected values only.
  std::vector<const bool*> flags_;
  std::vector<uint8_t> flag_expected_;
  std::vector<int> flag_paths_;  // into paths_: "model.1"
  std::vector<std::pair<bool*, bool>> flag_writes_;  // (flag, value the call leaves it at)
  std::vector<Children> children_;
  std::vector<const void*> expected_;      // Module* per child, in registry order
  std::vector<std::string> child_names_;   // parallel to expected_
  std::vector<std::string> paths_;
  // Bound tensors (Note [Watched modules]): the members LibTorch's module types read in forward,
  // and the TensorImpl each was bound to.
  struct BoundName {
    int root;  // into paths_
    bool buffer;
    std::string name;  // "fc.weight", below the root
  };
  struct Bound {
    const at::Tensor* member;
    const c10::TensorImpl* expected;
  };
  std::vector<Bound> bound_;
  std::vector<BoundName> bound_names_;  // parallel to bound_
  std::vector<std::shared_ptr<const torch::nn::Module>> alive_;  // every module read by the checks
};

}  // namespace warden

#endif  // WARDEN_RUNTIME_WATCH_H_
