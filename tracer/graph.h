// Warden's graph IR: values (arguments, captured constants, node results), nodes (one ATen op call
// each, with its non-tensor arguments as constants) and the outputs. The tracer builds it; guards/
// and the backends read it. Backend-specific state does not live here.
//
// Semantics. Nodes are in execution order and run exactly in that order: in-place ops and views
// alias as in eager (a node output that aliases one of its inputs records `alias_of`), random ops
// draw again on every run, and a node whose result is not a tensor (item(), is_nonzero) carries the
// value seen at trace time, which the artifact re-checks on every run (a value guard).
#ifndef WARDEN_TRACER_GRAPH_H_
#define WARDEN_TRACER_GRAPH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include "tracer/sym_expr.h"
#include "tracer/thread_mode.h"

namespace warden::tracer {

using ValueId = int32_t;
constexpr ValueId kNoValue = -1;

// Metadata of a tensor as seen during the trace.
struct TensorMeta {
  at::ScalarType dtype = at::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  bool requires_grad = false;
  bool is_leaf = true;  // no autograd history (Note [Leaf guard] in guards/builder.cc)

  static TensorMeta Of(const at::Tensor& t);
};

#define WARDEN_VALUE_KINDS(X) \
  X(kInput, "input")          \
  X(kConstant, "constant")    \
  X(kNode, "node")

enum class ValueKind : uint8_t {
#define WARDEN_X(name, text) name,
  WARDEN_VALUE_KINDS(WARDEN_X)
#undef WARDEN_X
};
const char* ValueKindName(ValueKind kind);

struct Value {
  ValueId id = kNoValue;
  ValueKind kind = ValueKind::kNode;
  bool is_tensor = true;      // false: a scalar result of a data-dependent op
  TensorMeta meta;            // tensors: metadata at trace time
  int arg_index = -1;         // kInput: position in the argument list
  at::Tensor constant;        // kConstant: captured by reference (not copied)
  int node = -1;              // kNode: producing node
  int output_index = 0;       // kNode: which flattened output of the producer
  ValueId alias_of = kNoValue;  // the value whose storage this one views (-1: own storage)
  c10::IValue traced_scalar;  // !is_tensor: the value seen at trace time
  // A data-dependent scalar (item()) that flows only into op arguments, which read it as a graph
  // value: the artifact passes it on instead of value-guarding it (Options::capture_scalar_outputs).
  bool captured = false;
};

// An element of an int or int[] constant that is, at run time, the size of an argument's dim times
// a constant (Note [Verified size reads] in runtime/verified_sizes.h): `view(%x, [arg0.size(0), -1])`,
// or nn::MultiheadAttention's `view(%q, [seq, arg0.size(1)*4, 8])` (batch times heads).
struct SizeRef {
  int elem = -1;  // index in the int[] (-1: the constant is a single int)
  int arg = -1;
  int dim = -1;
  int64_t scale = 1;
  friend bool operator==(const SizeRef& a, const SizeRef& b) {
    return a.elem == b.elem && a.arg == b.arg && a.dim == b.dim && a.scale == b.scale;
  }
};

// Note [Symbolic sizes] (tracer.cc): from LibTorch 2.8 on, C++ that reads sym_sizes() of a traced
// tensor gets symbolic SymInts; integers it computes from them and passes to ops are recorded as
// expressions over "size leaves" (a value's dim at trace time), and the comparisons it made on them
// as SymChecks. The shape pass turns both into expressions over the size symbols.
struct SymLeaf {
  ValueId value = kNoValue;
  int dim = -1;
  friend bool operator==(const SymLeaf& a, const SymLeaf& b) { return a.value == b.value && a.dim == b.dim; }
};

// An element of an int or int[] constant computed from size leaves (symbol k of `expr` is
// Graph::sym_leaves[k]); the constant holds its traced value.
struct SymElem {
  int elem = -1;  // index in the int[] (-1: the constant is a single int)
  SymExpr expr;
  friend bool operator==(const SymElem& a, const SymElem& b) { return a.elem == b.elem && a.expr == b.expr; }
};

// A comparison C++ made on symbolic sizes and the answer it got: `lhs op rhs` was `result`.
struct SymCheck {
  enum class Op : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe };
  Op op = Op::kEq;
  SymExpr lhs, rhs;  // over size leaves
  bool result = false;
  std::string by;  // "user code" or "aten::flatten (composite)"
  friend bool operator==(const SymCheck& a, const SymCheck& b) {
    return a.op == b.op && a.lhs == b.lhs && a.rhs == b.rhs && a.result == b.result;
  }
};

// One argument of a node, in schema order.
struct NodeArg {
  enum class Kind : uint8_t {
    kConstant,      // any non-tensor IValue (int, double, int[], ScalarType, None, ...)
    kValue,         // a tensor value
    kValueList,     // Tensor[]
    kOptValueList,  // Tensor?[] (kNoValue marks None)
  };
  Kind kind = Kind::kConstant;
  c10::IValue constant;
  ValueId value = kNoValue;
  std::vector<ValueId> values;
  // kConstant: elements that are argument sizes at run time (the constant holds the traced ones).
  std::vector<SizeRef> sizes_of;
  // kConstant: elements C++ computed from symbolic sizes (Note [Symbolic sizes]).
  std::vector<SymElem> sym_elems;
};

// How a node's returns map to values: each schema return is one tensor, a tensor list, or a
// non-tensor scalar.
struct NodeReturn {
  enum class Kind : uint8_t { kTensor, kTensorList, kScalar };
  Kind kind = Kind::kTensor;
  std::vector<ValueId> values;  // one for kTensor/kScalar, one per element for kTensorList
};

#define WARDEN_NODE_KINDS(X)                                                        \
  X(kRule, "rule")          /* op with a registered shape rule */                   \
  X(kOpaque, "opaque")      /* op without a rule: shapes specialized at trace time */ \
  X(kDataDependent, "data") /* result depends on tensor values: value-guarded */

enum class NodeKind : uint8_t {
#define WARDEN_X(name, text) name,
  WARDEN_NODE_KINDS(WARDEN_X)
#undef WARDEN_X
};
const char* NodeKindName(NodeKind kind);

struct Node {
  int index = 0;
  std::string op;  // "aten::add.Tensor"
  std::optional<c10::OperatorHandle> handle;
  NodeKind kind = NodeKind::kRule;
  std::vector<NodeArg> args;
  std::vector<NodeReturn> returns;
  bool mutates = false;     // writes one of its inputs (schema alias annotation with '!')
  bool random = false;      // draws from a generator
  bool factory = false;     // creates a tensor from sizes (may read the default dtype)
  // Set where the function changed thread-local state before this op (NoGradGuard, InferenceMode,
  // autocast): the state the op ran under, re-established by replay (Note [Thread modes]).
  std::optional<ThreadMode> mode;
  // Note [Captured gradients] (tracer.cc): added by the derivative rule of node `grad_of` for a
  // gradient the function took (-1: an op the function ran).
  int grad_of = -1;
  // The detach that ends a gradient the function took without create_graph (Note [Captured
  // gradients]): eager's autograd::grad returns the computed gradient itself, with no history
  // (Note [Gradient results] in runtime/codegen_replay.h).
  bool gradient_result = false;
  // A node of the forward that a compiled backward's graph recomputes (Note [Saved outputs] in
  // runtime/compiled_backward.cc): it already ran on the same inputs, so skipping it when nothing
  // reads its result changes no error (Note [Transposed twice] in runtime/codegen_replay.h).
  bool recomputed = false;
};

// What a graph argument was at trace time.
enum class ArgKind : uint8_t { kTensor, kUndefinedTensor, kInt, kDouble, kBool };
const char* ArgKindName(ArgKind kind);

class Graph {
 public:
  std::vector<Value> values;
  std::vector<Node> nodes;
  std::vector<ArgKind> arg_kinds;       // one per call argument
  std::vector<ValueId> arg_values;      // tensor args: their input value; others kNoValue
  std::vector<std::string> arg_names;
  std::vector<ValueId> outputs;         // kNoValue: an undefined tensor was returned
  ThreadMode entry_mode;                // the thread's state when the trace began (guarded)
  // Ops that took a train/training/use_input_stats flag from C++ (a module's train()/eval()
  // state, invisible to the trace): "aten::native_batch_norm at %3 (training=true)".
  std::vector<std::string> mode_dependent;
  // Note [Symbolic sizes]: the size leaves the op arguments' SymElems and the checks refer to.
  std::vector<SymLeaf> sym_leaves;
  std::vector<SymCheck> sym_checks;
  // Note [Captured gradients]: each gradient taken inside the function, as captured
  // ("d(%12) / d(theta) at %40..%57, create_graph=false").
  std::vector<std::string> gradients;

  ValueId AddValue(Value v);
  const Value& value(ValueId id) const { return values.at(id); }

  // The argument whose storage a value (transitively) views, or -1 (constant or fresh storage).
  int BaseArg(ValueId id) const;
  // The value at the end of the alias_of chain: the owner of `id`'s storage.
  ValueId RootOf(ValueId id) const;
  // Arguments written by some node (in-place op or out= on an argument or a view of one).
  std::vector<int> MutatedArgs() const;
  bool HasMutation() const;

  // Canonical text: arguments by name, constants %c0.., node results %<node>[.<k>].
  std::string ToString() const;
  // The same, with each tensor value's shape text supplied by `shape_of` (symbolic shapes).
  std::string ToString(const std::function<std::string(ValueId)>& shape_of) const;
  std::string ValueName(ValueId id) const;
};

// The tensor values a node reads, in argument order (each element of a Tensor[]; kNoValue for a
// None element of a Tensor?[]).
std::vector<ValueId> InputValues(const Node& n);
// The value of a node that returns exactly one tensor, else kNoValue.
ValueId SingleTensorResult(const Node& n);
// The values a node writes in place: the arguments its schema marks written (every input of a node
// without a schema).
std::vector<ValueId> WrittenValues(const Node& n);

std::string DtypeShort(at::ScalarType t);  // f32, i64, b8, ...
std::string ShapeString(const std::vector<int64_t>& sizes);  // [3, 4]
std::string IValueString(const c10::IValue& v);

}  // namespace warden::tracer

#endif  // WARDEN_TRACER_GRAPH_H_
