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
    const std::vector<bool> history_free = codegen::HistoryFreeNodes(g);
    const std::vector<bool> below = codegen::BelowAutogradNodes(g);
    // Note [Transposed twice], Note [Gradient results].
    const codegen::ReplaySimplification simple = codegen::SimplifyReplay(g, std::vector<bool>(g.nodes.size(), false));
    for (const tracer::Node& n : g.nodes) {
      if (simple.skip[n.index]) continue;
      steps_.push_back(codegen::MakeOpStep(g, n, slots, &simple.forward));
      steps_.back().no_grad = history_free[n.index];
      steps_.back().below_autograd = below[n.index];
      if (simple.pass[n.index]) steps_.back().pass_through = steps_.back().args.at(0).slot;
    }
    outputs_ = codegen::OutputList(g, slots);
    num_slots_ = slots.num_slots();
    PlanReleases();
  }

  // Hot path: one boxed call per node; takes no lock. The slot array and the stack are per-thread
  // scratch buffers reused across runs (allocation only when a graph needs more than any before on
  // this thread); tensor lists and the outputs vector still allocate.
  bool Run(const std::vector<c10::IValue>& args, std::vector<at::Tensor>* outputs,
           std::string* value_guard_failure) const override {
    if (steps_.empty()) return PassThrough(args, outputs);
    codegen::RunScratch scratch(num_slots_);
    std::vector<c10::IValue>& slots = scratch.slots();
    for (const auto& [arg, slot] : inputs_) slots[slot] = args[arg];
    for (size_t i = 0; i < steps_.size(); ++i) {
      if (!codegen::RunOpStep(steps_[i], slots, scratch.stack(), value_guard_failure)) return false;
      for (int slot : releases_[i]) slots[slot] = c10::IValue();
    }
    outputs_.FromSlots(slots, outputs);  // Note [Building outputs]
    return true;
  }

 private:
  // A graph that returns arguments and constants only: its outputs without a slot array.
  __attribute__((flatten)) bool PassThrough(const std::vector<c10::IValue>& args,
                                            std::vector<at::Tensor>* outputs) const {
    if (outputs_.all_args()) {
      outputs_.FromArgs(args, outputs);
      return true;
    }
    codegen::RunScratch scratch(num_slots_);
    std::vector<c10::IValue>& slots = scratch.slots();
    for (const auto& [arg, slot] : inputs_) slots[slot] = args[arg];
    outputs_.FromSlots(slots, outputs);
    return true;
  }

  // Note [Release after last use] in runtime/codegen_replay.h.
  void PlanReleases() {
    std::vector<std::vector<int>> uses(steps_.size());
    for (size_t i = 0; i < steps_.size(); ++i) codegen::AddSlotsOf(steps_[i], &uses[i]);
    std::vector<int> keep;
    for (const auto& [arg, slot] : inputs_) keep.push_back(slot);
    for (int slot : outputs_.slots()) keep.push_back(slot);
    releases_ = codegen::PlanReleases(num_slots_, uses, keep);
  }

  std::shared_ptr<const Graph> graph_;
  int num_slots_ = 0;
  std::vector<std::pair<int, int>> inputs_;  // (argument, slot)
  std::vector<codegen::OpStep> steps_;
  std::vector<std::vector<int>> releases_;  // per step: slots cleared after it (Note [Release after last use])
  codegen::OutputList outputs_;
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
