// Backend "aten": replays the recorded graph by calling each node's ATen op through its cached
// operator handle, in trace order, on the call's real tensors. Because it is the same ops in the
// same order, mutations of arguments, views and output aliasing behave exactly as in eager.
#include <ATen/core/stack.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "guards/guard.h"
#include "runtime/backend.h"

namespace warden {
namespace {

using tracer::Graph;
using tracer::NodeArg;
using tracer::NodeReturn;
using tracer::ValueId;

// One argument of a step, resolved at compile time: constants (including captured tensors) are
// pre-built IValues; node results index the per-run slot array; arguments are read in place
// (slot <= -2 means args[-slot - 2]), which saves a refcount round trip per argument.
struct StepArg {
  enum class Kind : uint8_t { kConstant, kSlot, kSlotList, kOptSlotList } kind;
  c10::IValue constant;
  int slot = -1;
  std::vector<int> slots;  // -1: None (optional lists) / constant index via constants_
  std::vector<c10::IValue> list_constants;  // list entries that are constants
};

struct StepReturn {
  NodeReturn::Kind kind;
  std::vector<int> slots;
  c10::IValue traced;  // kScalar: the value guard
};

struct Step {
  c10::OperatorHandle op;
  std::string name;
  int index;
  std::vector<StepArg> args;
  std::vector<StepReturn> returns;
  bool check_shapes = false;  // data-dependent output shape: value-guard the traced sizes
  std::vector<std::vector<int64_t>> traced_shapes;
};

bool SameScalar(const c10::IValue& a, const c10::IValue& b) {
  auto as_double = [](const c10::IValue& v, double* d) {
    if (v.isDouble()) { *d = v.toDouble(); return true; }
    if (v.isScalar() && v.toScalar().isFloatingPoint()) { *d = v.toScalar().toDouble(); return true; }
    return false;
  };
  double da, db;
  if (as_double(a, &da) && as_double(b, &db)) return guards::SameDouble(da, db);
  if (a.isBool() && b.isBool()) return a.toBool() == b.toBool();
  if (a.isInt() && b.isInt()) return a.toInt() == b.toInt();
  if (a.isComplexDouble() && b.isComplexDouble()) return a.toComplexDouble() == b.toComplexDouble();
  return false;
}

class ReplayArtifact final : public Artifact {
 public:
  explicit ReplayArtifact(std::shared_ptr<const Graph> graph) : graph_(std::move(graph)) {
    const Graph& g = *graph_;
    slot_of_.assign(g.values.size(), -1);
    for (size_t i = 0; i < g.arg_values.size(); ++i) {
      if (g.arg_values[i] != tracer::kNoValue) slot_of_[g.arg_values[i]] = ArgSlot(static_cast<int>(i));
    }
    auto slot = [&](ValueId id) {
      if (slot_of_[id] == -1) slot_of_[id] = num_slots_++;
      return slot_of_[id];
    };
    auto ref = [&](ValueId id, StepArg* a) {
      const tracer::Value& v = g.value(id);
      if (v.kind == tracer::ValueKind::kConstant) return false;
      a->slot = slot(id);
      return true;
    };
    for (const tracer::Node& n : g.nodes) {
      Step s{*n.handle, n.op, n.index, {}, {}, false, {}};
      for (const NodeArg& na : n.args) {
        StepArg a;
        switch (na.kind) {
          case NodeArg::Kind::kConstant:
            a.kind = StepArg::Kind::kConstant;
            a.constant = na.constant;
            break;
          case NodeArg::Kind::kValue:
            a.kind = StepArg::Kind::kSlot;
            if (!ref(na.value, &a)) {
              a.kind = StepArg::Kind::kConstant;
              a.constant = g.value(na.value).constant;
            }
            break;
          case NodeArg::Kind::kValueList:
          case NodeArg::Kind::kOptValueList:
            a.kind = na.kind == NodeArg::Kind::kValueList ? StepArg::Kind::kSlotList
                                                          : StepArg::Kind::kOptSlotList;
            for (ValueId id : na.values) {
              if (id == tracer::kNoValue) {
                a.slots.push_back(-1);
                a.list_constants.emplace_back();
              } else if (g.value(id).kind == tracer::ValueKind::kConstant) {
                a.slots.push_back(-1);
                a.list_constants.emplace_back(g.value(id).constant);
              } else {
                a.slots.push_back(slot(id));
                a.list_constants.emplace_back();
              }
            }
            break;
        }
        s.args.push_back(std::move(a));
      }
      for (const NodeReturn& r : n.returns) {
        StepReturn sr{r.kind, {}, {}};
        for (ValueId id : r.values) {
          sr.slots.push_back(slot(id));
          if (r.kind == NodeReturn::Kind::kScalar) sr.traced = g.value(id).traced_scalar;
          if (r.kind != NodeReturn::Kind::kScalar && n.kind == tracer::NodeKind::kDataDependent) {
            s.check_shapes = true;
            s.traced_shapes.push_back(g.value(id).meta.sizes);
          }
        }
        s.returns.push_back(std::move(sr));
      }
      steps_.push_back(std::move(s));
    }
    for (ValueId id : g.outputs) {
      if (id == tracer::kNoValue) {
        outputs_.push_back({-1, at::Tensor()});
      } else if (g.value(id).kind == tracer::ValueKind::kConstant) {
        outputs_.push_back({-1, g.value(id).constant});
      } else {
        outputs_.push_back({slot(id), at::Tensor()});
      }
    }
  }

  // Hot path: one boxed call per node; takes no lock. The slot array and the stack are per-thread
  // scratch buffers reused across runs (allocation only when a graph needs more than any before
  // on this thread); tensor lists and the outputs vector still allocate.
  bool Run(const std::vector<c10::IValue>& args, std::vector<at::Tensor>* outputs,
           std::string* value_guard_failure) const override {
    if (steps_.empty()) {  // the graph returns arguments and constants only
      Scratch none;
      return RunWith(args, outputs, value_guard_failure, none);
    }
    thread_local Scratch scratch;
    Scratch local;
    Scratch& buffers = scratch.busy ? local : scratch;  // re-entrant runs get their own
    buffers.busy = true;
    struct Release {
      Scratch& s;
      ~Release() {
        s.slots.clear();  // drop the references, keep the capacity
        s.stack.clear();
        s.busy = false;
      }
    } release{buffers};
    return RunWith(args, outputs, value_guard_failure, buffers);
  }

 private:
  struct Scratch {
    std::vector<c10::IValue> slots;
    torch::jit::Stack stack;
    bool busy = false;
  };

  bool RunWith(const std::vector<c10::IValue>& args, std::vector<at::Tensor>* outputs,
               std::string* value_guard_failure, Scratch& buffers) const {
    std::vector<c10::IValue>& slots = buffers.slots;
    slots.resize(num_slots_);
    auto get = [&](int slot) -> const c10::IValue& {
      return slot >= 0 ? slots[slot] : args[-slot - 2];
    };
    torch::jit::Stack& stack = buffers.stack;
    for (const Step& s : steps_) {
      stack.clear();
      stack.reserve(s.args.size());
      for (const StepArg& a : s.args) {
        switch (a.kind) {
          case StepArg::Kind::kConstant:
            stack.push_back(a.constant);
            break;
          case StepArg::Kind::kSlot:
            stack.push_back(get(a.slot));
            break;
          case StepArg::Kind::kSlotList: {
            c10::List<at::Tensor> list;
            list.reserve(a.slots.size());
            for (size_t k = 0; k < a.slots.size(); ++k) {
              list.push_back(a.slots[k] != -1 ? get(a.slots[k]).toTensor()
                                              : a.list_constants[k].toTensor());
            }
            stack.emplace_back(std::move(list));
            break;
          }
          case StepArg::Kind::kOptSlotList: {
            c10::List<c10::optional<at::Tensor>> list;
            for (size_t k = 0; k < a.slots.size(); ++k) {
              if (a.slots[k] != -1) {
                list.push_back(get(a.slots[k]).toTensor());
              } else if (a.list_constants[k].isTensor()) {
                list.push_back(a.list_constants[k].toTensor());
              } else {
                list.push_back(c10::nullopt);
              }
            }
            stack.emplace_back(std::move(list));
            break;
          }
        }
      }
      s.op.callBoxed(&stack);
      size_t shape_index = 0;
      for (size_t j = 0; j < s.returns.size(); ++j) {
        const StepReturn& r = s.returns[j];
        c10::IValue& out = stack[j];
        switch (r.kind) {
          case NodeReturn::Kind::kTensor:
            if (!r.slots.empty()) slots[r.slots[0]] = std::move(out);
            break;
          case NodeReturn::Kind::kTensorList: {
            auto list = out.toTensorVector();
            if (list.size() != r.slots.size()) {
              *value_guard_failure = absl::StrCat("number of results of ", s.name, " at %", s.index,
                                                  " changed: expected ", r.slots.size(), ", actual ",
                                                  list.size());
              return false;
            }
            for (size_t k = 0; k < list.size(); ++k) slots[r.slots[k]] = std::move(list[k]);
            break;
          }
          case NodeReturn::Kind::kScalar:
            if (!SameScalar(out, r.traced)) {
              *value_guard_failure =
                  absl::StrCat("value of ", s.name, " at %", s.index, " changed: expected ",
                               tracer::IValueString(r.traced), ", actual ", tracer::IValueString(out));
              return false;
            }
            break;
        }
        if (s.check_shapes && r.kind != NodeReturn::Kind::kScalar) {
          for (int slot : r.slots) {
            const auto sizes = slots[slot].toTensor().sizes();
            const auto& traced = s.traced_shapes[shape_index++];
            if (!sizes.equals(traced)) {
              *value_guard_failure = absl::StrCat(
                  "value of ", s.name, " at %", s.index, " changed: expected shape ",
                  tracer::ShapeString(traced), ", actual ", tracer::ShapeString(sizes.vec()));
              return false;
            }
          }
        }
      }
    }
    outputs->clear();
    outputs->reserve(outputs_.size());
    for (const auto& [slot, constant] : outputs_) {
      outputs->push_back(slot != -1 ? get(slot).toTensor() : constant);
    }
    return true;
  }

  std::shared_ptr<const Graph> graph_;
  std::vector<int> slot_of_;
  int num_slots_ = 0;
  static int ArgSlot(int arg) { return -arg - 2; }
  std::vector<Step> steps_;
  std::vector<std::pair<int, at::Tensor>> outputs_;  // slot, or -1 and a constant / undefined
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
