// Boxed replay of single graph nodes, for backends that run part of a graph as compiled code and
// the rest as the recorded ATen calls ("cpp" runs every unfused node, and a fused region whose
// run-time check fails, through these steps). Same semantics as backend "aten": the node's op
// through its cached OperatorHandle, value guards on scalar results and data-dependent shapes.
// No fusion or compilation lives here.
#ifndef WARDEN_RUNTIME_CODEGEN_REPLAY_H_
#define WARDEN_RUNTIME_CODEGEN_REPLAY_H_

#include <iterator>
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
  std::vector<int64_t> ints;                // an int[] constant, converted once
};

// kRunTimeSizes of an int[]: writes this run's sizes (times their scale) into `ints`, a copy of
// `a.ints`.
void PatchRunTimeSizes(const OpStepArg& a, const std::vector<c10::IValue>& slots, int64_t* ints);

struct OpStepReturn {
  tracer::NodeReturn::Kind kind;
  std::vector<int> slots;
  c10::IValue traced;     // kScalar: the value guard
  bool captured = false;  // kScalar: no guard, the value goes to its slot (tracer::Value::captured)
};

struct OpStep;
// Note [Unboxed replay] (runtime/replay_unboxed.cc): a step that calls its op's ATen function.
using UnboxedFn = at::Tensor (*)(const OpStep& step, const std::vector<c10::IValue>& slots);
// Note [Native kernels] (runtime/native_kernels.cc): a kernel compiled into Warden for the step's
// op. Returns false, having touched nothing, when its run-time checks fail (the ATen call runs).
using NativeFn = bool (*)(const OpStep& step, std::vector<c10::IValue>& slots);

// One node as a boxed call (or an unboxed one, Note [Unboxed replay]).
struct OpStep {
  c10::OperatorHandle op;
  std::string name;
  int index = 0;
  std::vector<OpStepArg> args;
  std::vector<OpStepReturn> returns;
  bool check_shapes = false;  // data-dependent output shape: value-guard the traced sizes
  std::vector<std::vector<int64_t>> traced_shapes;
  std::optional<tracer::ThreadMode> mode;  // Note [Thread modes]: the state the call runs under
  UnboxedFn unboxed = nullptr;              // set when the op has an exact unboxed match
  bool no_grad = false;  // Note [History-free nodes]: runs with grad mode off
  bool below_autograd = false;  // Note [Below autograd]: may skip the autograd and view-tracking keys
  int pass_through = -1;        // Note [Gradient results]: the slot whose tensor may be the result
  NativeFn native = nullptr;    // Note [Native kernels]: backend cpp sets it (SetNative)
  std::vector<int64_t> native_params;  // what `native` reads of the constant arguments
};

// Note [Gradient results]
// A gradient the function takes without create_graph ends in a detach the trace records (Note
// [Captured gradients] in tracer/tracer.cc), where eager's autograd::grad returns the computed
// gradient itself. Replayed, that detach made a second TensorImpl of every gradient: six per MLP
// training step, ~1.5% of its samples inside the compiled backward. So a detach marked as a
// gradient result (tracer::Node::gradient_result) whose input is a tensor of its own storage made
// by this run, read by nothing else and not returned, passes that tensor through instead when the
// tensor has no autograd metadata (no history, no requires_grad, no forward gradient: what eager's
// grad returns, and what the detach would have returned but for the TensorImpl). Otherwise the
// detach runs. Nothing else can see the difference: the input is unreachable after this step.
//
// Note [Transposed twice]
// t(t(x)) is x, and so is alias(x): the same storage, offset, sizes and strides. The derivative
// rules of t and of addmm / mm make t(t(W)) for every linear layer's input gradient and
// t(t(mm(...))) for its weight's; the compiled backward reads every saved output through an alias
// (Note [Saved outputs] in runtime/compiled_backward.cc) and recomputes t(W) steps nothing reads
// once the matmul is saved. A replay step (not a fused region, whose code reads its own inputs)
// that reads such a value reads x instead, when the value is not returned, is read by no op that
// writes in place or is composite (whose kernel may compare tensors by identity), nothing
// writes the storage, and no requires_grad_ on the storage follows the first view of the chain (a
// view made before it has no grad_fn in eager, so no gradient reaches the base through it). A `t`
// or `alias` step whose result no remaining step, fused region or output reads is then not run
// (on a guarded tensor neither can fail, so skipping one changes no error).
// Neither is a node of the forward that a compiled backward recomputes (tracer::Node::recomputed:
// it already ran on the same inputs, so it cannot fail either) and that nothing reads, such as a
// training step's loss. In an MLP training step's backward graph, 11 of 14 `t` steps and the
// recomputed `nll_loss` are not run.
struct ReplaySimplification {
  std::vector<tracer::ValueId> forward;  // per value: the value a replay step reads instead (or itself)
  std::vector<bool> skip;                // per node: a step that is not run
  std::vector<bool> pass;                // per node: Note [Gradient results]
};
// `fused`: per node, inside a fused region or program (its reads are not forwarded and keep their
// values' steps).
ReplaySimplification SimplifyReplay(const tracer::Graph& graph, const std::vector<bool>& fused);

// Steps this thread has passed through so far (tests).
int64_t PassThroughCallsOnThisThread();
// Replay steps (RunOpStep calls) this thread has run so far (tests).
int64_t ReplayStepsOnThisThread();

// Note [Below autograd]
// With grad mode off, an op's Autograd kernel records nothing and only redispatches, and its
// ADInplaceOrView kernel matters only for views (their view metadata and the version counter they
// share with their base) and for writes in place (version bumps). A replayed view op still paid
// for both: `t` of a parameter built a DifferentiableViewMeta on every call (`t` calls were 6% of
// an MLP training step's perf samples). Where Warden is the autograd (inside the compiled backward's forward, whose
// outputs get a WardenNode, and inside its backward graph: ScopedBelowAutograd), a step whose
// result cannot be observed as a view runs below both keys (at::AutoDispatchBelowADInplaceOrView),
// with grad mode off as it was to run anyway. BelowAutogradNodes says which nodes qualify: none
// that writes in place or runs under a recorded thread mode, and none with a result that views
// another value and is returned, read by a node that writes in place or by a composite op (whose
// kernel may branch on requires_grad(), which a view of a parameter reports only when made with the
// keys), or the base (any input of the same storage) of a view that is itself observable or made
// with every key (its base or version counter would show). A chain of views read only by
// non-composite functional ops (t(t(g)) feeding a matmul) runs below. The same call elsewhere
// keeps every key: a tensor with a forward-mode gradient needs the Autograd kernel even with grad
// mode off.
std::vector<bool> BelowAutogradNodes(const tracer::Graph& graph);

// Steps this thread has run below the autograd keys so far (tests).
int64_t BelowAutogradCallsOnThisThread();

// While alive, steps marked below_autograd run below the autograd keys on this thread (Note [Below
// autograd]). Nests.
class ScopedBelowAutograd {
 public:
  ScopedBelowAutograd();
  ~ScopedBelowAutograd();
  ScopedBelowAutograd(const ScopedBelowAutograd&) = delete;
  ScopedBelowAutograd& operator=(const ScopedBelowAutograd&) = delete;

 private:
  bool previous_;
};

// Note [History-free nodes]
// A node none of whose results is an ancestor of an output that requires grad builds autograd
// history nobody can observe: the gradients a function takes inside itself are graph nodes (Note
// [Captured gradients] in tracer/tracer.cc), not replays of that history. Such nodes replay with
// grad mode off, and a fused region of them may read inputs that require grad. Per node; all
// false when the entry runs with grad mode off (nothing is recorded anyway). A write in place is
// needed as soon as any value of the storage it writes is (autograd rebases views on it).
std::vector<bool> HistoryFreeNodes(const tracer::Graph& graph);

// Sets step->unboxed (and the converted int[] constants it reads) when the step is an exact match
// of Note [Unboxed replay]; leaves it null otherwise.
void SetUnboxed(OpStep* step);
// Unboxed calls made by this thread so far (tests).
int64_t UnboxedCallsOnThisThread();
void CountUnboxedCall();

// Sets step->native (and native_params) when Note [Native kernels] has a kernel for the step's op
// and constant arguments; leaves it null otherwise. Backend "cpp" only ("aten" replays ATen).
void SetNative(OpStep* step);
// Whether SetNative may give a step of `node` a native kernel (by op; its arguments may still rule
// it out).
bool MayRunNative(const tracer::Node& node);
// Native kernel calls made by this thread so far (tests).
int64_t NativeCallsOnThisThread();

// Requires n.handle (backends reject graphs with handle-less nodes before building steps).
// `forward` (Note [Transposed twice]): per value, the value the step reads instead.
OpStep MakeOpStep(const tracer::Graph& graph, const tracer::Node& n, SlotMap& slots,
                  const std::vector<tracer::ValueId>* forward = nullptr);

// Runs one step on `slots`, using `stack` as scratch. Returns false, with the reason in *failure,
// when a value guard fails (before the step's results are published into later slots' readers).
bool RunOpStep(const OpStep& s, std::vector<c10::IValue>& slots, torch::jit::Stack& stack,
               std::string* failure);

// Note [Release after last use]
// Eager drops an intermediate when its last C++ handle goes out of scope, so a chain of ops
// reuses a few hot blocks of the allocator; holding every intermediate until the end of the run
// makes each op write a new, cold block (a 10-op chain on 1M floats replayed ~1.6x slower than
// eager; a ResNet block on the fused backend took ~2,000 minor page faults per call, glibc handing
// the memory back to the OS every time). So each slot that is neither an argument nor an output is
// cleared after the last step that reads or writes it. Dropping a slot only drops a reference:
// views and in-place results that share its storage keep it alive through their own slots.
//
// The slots an op step reads or writes (-1 for its constants).
void AddSlotsOf(const OpStep& s, std::vector<int>* slots);
// Per step, the slots to clear after it: `uses[i]` are the slots step i reads or writes, `keep`
// the slots that outlive the run (arguments, outputs); negative entries (constants) are ignored.
std::vector<std::vector<int>> PlanReleases(int num_slots, const std::vector<std::vector<int>>& uses,
                                           const std::vector<int>& keep);

// Note [Building outputs]
// A hit's results are built with as little per-output work as the vector allows: an output that
// is the last reader of its slot is moved out of it (the run's slots are cleared afterwards
// anyway), saving a reference-count increment and decrement; and a graph whose outputs are all
// arguments (no step runs) constructs the vector once from the arguments, without a capacity check
// per element.
class OutputList {
 public:
  OutputList() = default;
  // The graph's outputs, in order: a value's slot (requested from `slots`), a constant, or
  // undefined.
  OutputList(const tracer::Graph& graph, SlotMap& slots);
  // The outputs from the run's slots (moved out of each slot's last reader).
  void FromSlots(std::vector<c10::IValue>& slots, std::vector<at::Tensor>* out) const {
    out->clear();
    out->reserve(sources_.size());
    for (const Source& s : sources_) {
      if (s.slot < 0) {
        out->push_back(s.constant);
      } else if (s.last_reader) {
        out->push_back(std::move(slots[s.slot]).toTensor());
      } else {
        out->push_back(slots[s.slot].toTensor());
      }
    }
  }
  // Whether every output is an argument (then FromArgs applies).
  bool all_args() const { return !args_.empty() && args_.size() == sources_.size(); }
  // The outputs straight from the arguments; requires all_args().
  void FromArgs(const std::vector<c10::IValue>& args, std::vector<at::Tensor>* out) const {
    out->assign(ArgTensors{args.data(), args_.data()}, ArgTensors{args.data(), args_.data() + args_.size()});
  }
  std::vector<int> slots() const;

 private:
  // A value's slot, or -1 for `constant` (a captured tensor, or undefined); `arg`: the argument the
  // value is, or -1.
  void Add(int slot, int arg, at::Tensor constant);
  struct Source {
    int slot = -1;
    bool last_reader = false;  // no later output reads the slot
    at::Tensor constant;
  };
  // Forward iterator over the tensors of args[index[k]].
  struct ArgTensors {
    using iterator_category = std::forward_iterator_tag;
    using value_type = at::Tensor;
    using difference_type = std::ptrdiff_t;
    using pointer = const at::Tensor*;
    using reference = const at::Tensor&;
    const c10::IValue* args;
    const int* index;
    reference operator*() const { return args[*index].toTensor(); }
    ArgTensors& operator++() {
      ++index;
      return *this;
    }
    ArgTensors operator++(int) {
      ArgTensors old = *this;
      ++index;
      return old;
    }
    bool operator==(const ArgTensors& o) const { return index == o.index; }
    bool operator!=(const ArgTensors& o) const { return index != o.index; }
  };
  std::vector<Source> sources_;
  std::vector<int> args_;  // the outputs' arguments, as long as every output so far is one
};

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
