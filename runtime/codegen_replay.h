// Boxed replay of single graph nodes, for backends that run part of a graph as compiled code and
// the rest as the recorded ATen calls ("cpp" runs every unfused node, and a fused region whose
// run-time check fails, through these steps). Same semantics as backend "aten": the node's op
// through its cached OperatorHandle, value guards on scalar results and data-dependent shapes.
// No fusion or compilation lives here.
#ifndef WARDEN_RUNTIME_CODEGEN_REPLAY_H_
#define WARDEN_RUNTIME_CODEGEN_REPLAY_H_

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include "tracer/graph.h"

namespace warden::codegen {

// Value -> slot of the per-run value array. Constants get no slot (their IValue is baked into the
// steps); arguments and node results get one on first request.
class SlotMap {
 public:
  explicit SlotMap(const tracer::Graph& graph) : graph_(graph), slot_of_(graph.values.size(), -1) {}
  // The slot of `id`, or -1 for a constant.
  int Slot(tracer::ValueId id);
  int num_slots() const { return num_slots_; }

 private:
  const tracer::Graph& graph_;
  std::vector<int> slot_of_;
  int num_slots_ = 0;
};

// One argument of a step, resolved at compile time: constants (including captured tensors) are
// pre-built IValues; values index the per-run slot array.
struct OpStepArg {
  // kRunTimeSizes: an int / int[] constant some of whose elements are argument sizes of this run
  // times a constant (tracer::SizeRef): `constant` with sizes[k] = {element, slot of the argument,
  // dim, scale} patched in.
  enum class Kind : uint8_t { kConstant, kSlot, kSlotList, kOptSlotList, kRunTimeSizes } kind = Kind::kConstant;
  struct RunTimeSize {
    int elem, slot, dim;
    int64_t scale;
  };
  std::vector<RunTimeSize> sizes;
  c10::IValue constant;
  int slot = -1;
  std::vector<int> slots;                   // -1: None or a constant entry of list_constants
  std::vector<c10::IValue> list_constants;  // list entries that are constants
};

struct OpStepReturn {
  tracer::NodeReturn::Kind kind;
  std::vector<int> slots;
  c10::IValue traced;     // kScalar: the value guard
  bool captured = false;  // kScalar: no guard, the value goes to its slot (tracer::Value::captured)
};

// One node as a boxed call.
struct OpStep {
  c10::OperatorHandle op;
  std::string name;
  int index = 0;
  std::vector<OpStepArg> args;
  std::vector<OpStepReturn> returns;
  bool check_shapes = false;  // data-dependent output shape: value-guard the traced sizes
  std::vector<std::vector<int64_t>> traced_shapes;
  std::optional<tracer::ThreadMode> mode;  // Note [Thread modes]: the state the call runs under
};

// Requires n.handle (backends reject graphs with handle-less nodes before building steps).
OpStep MakeOpStep(const tracer::Graph& graph, const tracer::Node& n, SlotMap& slots);

// Runs one step on `slots`, using `stack` as scratch. Returns false, with the reason in *failure,
// when a value guard fails (before the step's results are published into later slots' readers).
bool RunOpStep(const OpStep& s, std::vector<c10::IValue>& slots, torch::jit::Stack& stack,
               std::string* failure);

// The per-run buffers of a replaying artifact: a slot array of `num_slots` values and a stack,
// taken from this thread's reusable pair (a re-entrant run on the same thread gets fresh ones)
// and cleared on destruction, which drops the references and keeps the capacity.
class RunScratch {
 public:
  explicit RunScratch(int num_slots);
  ~RunScratch();
  RunScratch(const RunScratch&) = delete;
  RunScratch& operator=(const RunScratch&) = delete;

  std::vector<c10::IValue>& slots() { return buffers_->slots; }
  torch::jit::Stack& stack() { return buffers_->stack; }

 private:
  struct Buffers {
    std::vector<c10::IValue> slots;
    torch::jit::Stack stack;
    bool busy = false;
  };
  static Buffers& ThreadBuffers();
  Buffers local_;
  Buffers* buffers_;
};

}  // namespace warden::codegen

#endif  // WARDEN_RUNTIME_CODEGEN_REPLAY_H_
