// Backend "aten": replays the recorded graph by calling each node's ATen op through its cached
// operator handle, in trace order, on the call's real tensors. Because it is the same ops in the
// same order, mutations of arguments, views and output aliasing behave exactly as in eager.
// The per-node steps (and their value guards) live in runtime/codegen_replay.h, shared with the
// code-generating backend's unfused nodes.
#include <ATen/core/stack.h>

#include "absl/strings/str_cat.h"
#include "runtime/backend.h"
#include "runtime/codegen_replay.h"

namespace warden {
namespace {

using tracer::Graph;
using tracer::ValueId;

class ReplayArtifact final : public Artifact {
 public:
  explicit ReplayArtifact(std::shared_ptr<const Graph> graph) : graph_(std::move(graph)) {
    const Graph& g = *graph_;
    codegen::SlotMap slots(g);
    for (size_t i = 0; i < g.arg_values.size(); ++i) {
      if (g.arg_values[i] != tracer::kNoValue) {
        inputs_.push_back({static_cast<int>(i), slots.Slot(g.arg_values[i])});
      }
    }
    for (const tracer::Node& n : g.nodes) steps_.push_back(codegen::MakeOpStep(g, n, slots));
    for (ValueId id : g.outputs) {
      Output out;
      if (id == tracer::kNoValue) {
        // undefined tensor
      } else if (g.value(id).kind == tracer::ValueKind::kConstant) {
        out.constant = g.value(id).constant;
      } else {
        out.slot = slots.Slot(id);
        if (g.value(id).kind == tracer::ValueKind::kInput) out.arg = g.value(id).arg_index;
      }
      outputs_.push_back(std::move(out));
    }
    num_slots_ = slots.num_slots();
    PlanReleases();
  }

  // Hot path: one boxed call per node; takes no lock. The slot array and the stack are per-thread
  // scratch buffers reused across runs (allocation only when a graph needs more than any before on
  // this thread); tensor lists and the outputs vector still allocate.
  bool Run(const std::vector<c10::IValue>& args, std::vector<at::Tensor>* outputs,
           std::string* value_guard_failure) const override {
    outputs->clear();
    outputs->reserve(outputs_.size());
    if (steps_.empty()) {  // the graph returns arguments and constants only
      for (const Output& o : outputs_) {
        outputs->push_back(o.arg >= 0 ? args[o.arg].toTensor() : o.constant);
      }
      return true;
    }
    codegen::RunScratch scratch(num_slots_);
    std::vector<c10::IValue>& slots = scratch.slots();
    for (const auto& [arg, slot] : inputs_) slots[slot] = args[arg];
    for (size_t i = 0; i < steps_.size(); ++i) {
      if (!codegen::RunOpStep(steps_[i], slots, scratch.stack(), value_guard_failure)) return false;
      for (int slot : releases_[i]) slots[slot] = c10::IValue();
    }
    for (const Output& o : outputs_) {
      outputs->push_back(o.slot >= 0 ? slots[o.slot].toTensor() : o.constant);
    }
    return true;
  }

 private:
  // Note [Release after last use]
  // Eager drops an intermediate when its last C++ handle goes out of scope, so a chain of ops
  // reuses a few hot blocks of the allocator; holding every intermediate until the end of the run
  // makes each op write a new, cold block (a 10-op chain on 1M floats replayed ~1.6x slower than
  // eager, while at 16M floats, where nothing fits in cache either way, it did not). So each slot
  // that is neither an argument nor an output is cleared after the last step that reads or writes
  // it. Dropping a slot only drops a reference: views and in-place results that share its storage
  // keep it alive through their own slots.
  void PlanReleases() {
    std::vector<int> last(num_slots_, -1);
    std::vector<bool> keep(num_slots_, false);
    for (const auto& [arg, slot] : inputs_) keep[slot] = true;
    for (const Output& o : outputs_) {
      if (o.slot >= 0) keep[o.slot] = true;
    }
    for (size_t i = 0; i < steps_.size(); ++i) {
      auto use = [&](int slot) {
        if (slot >= 0) last[slot] = static_cast<int>(i);
      };
      for (const codegen::OpStepArg& a : steps_[i].args) {
        use(a.slot);
        for (int slot : a.slots) use(slot);
      }
      for (const codegen::OpStepReturn& r : steps_[i].returns) {
        for (int slot : r.slots) use(slot);
      }
    }
    releases_.assign(steps_.size(), {});
    for (int slot = 0; slot < num_slots_; ++slot) {
      if (!keep[slot] && last[slot] >= 0) releases_[last[slot]].push_back(slot);
    }
  }

  struct Output {
    int slot = -1;        // a value of the graph
    int arg = -1;         // it is this argument (used when the graph has no steps)
    at::Tensor constant;  // slot < 0: a captured constant, or undefined
  };

  std::shared_ptr<const Graph> graph_;
  int num_slots_ = 0;
  std::vector<std::pair<int, int>> inputs_;  // (argument, slot)
  std::vector<codegen::OpStep> steps_;
  std::vector<std::vector<int>> releases_;  // per step: slots cleared after it (Note [Release after last use])
  std::vector<Output> outputs_;
};

class AtenBackend final : public Backend {
 public:
  std::string name() const override { return "aten"; }
  absl::StatusOr<std::unique_ptr<Artifact>> Compile(std::shared_ptr<const Graph> graph) override {
    for (const tracer::Node& n : graph->nodes) {
      if (!n.handle) return absl::InternalError(absl::StrCat("node %", n.index, " has no operator"));
    }
    return std::unique_ptr<Artifact>(new ReplayArtifact(std::move(graph)));
  }
};

const bool registered = [] {
  RegisterBackend("aten", [] { return std::unique_ptr<Backend>(new AtenBackend()); });
  return true;
}();

}  // namespace
}  // namespace warden
