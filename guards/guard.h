// Guard kinds and their texts. A Guard is one property of the call's arguments (or of global
// state) that a cache entry depends on, with the provenance that says who needed it. The compiled
// form used on the hot path lives in guards/evaluator.h; derivation from a trace in builder.h.
#ifndef WARDEN_GUARDS_GUARD_H_
#define WARDEN_GUARDS_GUARD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "tracer/sym_expr.h"

namespace warden::guards {

// One table lists the kinds, cheapest first: the evaluator runs guards in this order, and every
// tensor guard of an argument comes after that argument's type guard.
#define WARDEN_GUARD_KINDS(X)                                              \
  X(kGradMode, "grad_mode")                                                \
  X(kInferenceMode, "inference_mode")                                      \
  X(kDefaultDtype, "default_dtype")                                        \
  X(kThreadIncludedKeys, "thread_included_keys") /* Note [Thread modes] */   \
  X(kThreadExcludedKeys, "thread_excluded_keys") /* autocast, below-autograd */ \
  X(kAutocastDtype, "autocast_dtype")                                      \
  X(kArgCount, "arg_count")                                                \
  X(kArgType, "type")                                                      \
  X(kDispatchKeys, "dispatch_keys") /* Note [Dispatch keys]: before any size */ \
  X(kDtype, "dtype")                                                       \
  X(kDevice, "device")                                                     \
  X(kLayout, "layout")                                                     \
  X(kRequiresGrad, "requires_grad")                                        \
  X(kRank, "rank")                                                         \
  X(kSize, "size")                                                         \
  X(kSizeAtLeast, "size_at_least")  /* a symbolic dim: size >= expected */  \
  X(kSizeRelation, "size_relation") /* lhs == rhs over argument sizes */    \
  X(kStride, "stride")                                                     \
  X(kIntValue, "int_value")                                                \
  X(kDoubleValue, "double_value")                                          \
  X(kBoolValue, "bool_value")                                              \
  X(kAliasing, "aliasing")                                                \
  X(kArgIdentity, "arg_identity")   /* Note [Argument identity] */          \
  X(kCapturedTensor, "captured_tensor") /* Note [Captured tensors] */

enum class GuardKind : uint8_t {
#define WARDEN_X(name, text) name,
  WARDEN_GUARD_KINDS(WARDEN_X)
#undef WARDEN_X
};
const char* GuardKindName(GuardKind kind);

// The kinds that are an exact match on one integer property of the call (argument count, types,
// dtypes, ranks, static sizes, scalar values): what a guard signature hashes and compares
// (guards/signature.h), and what a program run after an exact signature match can skip.
bool IsKeyed(GuardKind kind);

// The kRequiresGrad guard's value (Note [Leaf guard] in guards/builder.cc): 0 no grad, 1 requires
// grad and is a leaf, 2 requires grad and has autograd history.
inline int64_t GradState(bool requires_grad, bool is_leaf) { return requires_grad ? (is_leaf ? 1 : 2) : 0; }
inline int64_t GradStateOf(const at::Tensor& t) { return t.requires_grad() ? (t.is_leaf() ? 1 : 2) : 0; }

// What an argument is, as the kArgType guard sees it.
enum class ArgType : uint8_t { kTensor, kUndefinedTensor, kInt, kDouble, kBool, kOther };
const char* ArgTypeName(ArgType t);
ArgType ArgTypeOf(const c10::IValue& v);

// What a kCapturedTensor guard holds: a tensor the function captured (a plain tensor an op of the
// graph read), as it was when the trace first saw it. Note [Captured tensors].
struct CapturedTensor {
  at::Tensor tensor;     // the captured tensor itself (the entry's graph holds it as well)
  std::string name;      // its name in the graph, "%c0"
  at::ScalarType dtype = at::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  uint64_t keys = 0;     // DispatchKeySet::raw_repr()
  bool requires_grad = false;
  // A plain TensorImpl (not a subclass, so reading its sizes cannot throw): sizes, strides and the
  // storage offset are guarded too.
  bool plain = false;
  std::vector<int64_t> sizes, strides;
  int64_t storage_offset = 0;

  static CapturedTensor Of(const at::Tensor& t, std::string name);
};

struct Guard {
  GuardKind kind;
  int arg = -1;        // argument index (-1 for global state)
  int dim = -1;        // kSize / kStride
  int other_arg = -1;  // kAliasing
  int64_t expected = 0;       // ints, sizes, strides, enums (dtype, device type, layout), bools
  double expected_double = 0; // kDoubleValue
  std::string provenance;     // who needed it: "used by aten::add.Tensor at %0", "read by user code"
  // kSizeRelation: lhs == rhs, where symbol k of the expressions is
  // args[symbols[k].first].size(symbols[k].second).
  tracer::SymExpr lhs, rhs;
  std::vector<std::pair<int, int>> symbols;
  // kArgIdentity: per argument, the first argument that is the same tensor object (itself when
  // none is), or -1 for arguments that are not defined tensors.
  std::vector<int32_t> same_as;
  // kCapturedTensor.
  std::shared_ptr<const CapturedTensor> captured;
};

// The identity partition of the tensor arguments of `args`, as kArgIdentity's same_as.
std::vector<int32_t> IdentityOf(const std::vector<c10::IValue>& args);

// The values of a relation guard's symbols on `args` (sizes; -1 where unreadable).
std::vector<int64_t> SymbolValues(const Guard& g, const std::vector<c10::IValue>& args);

// Reads the property a guard checks from the current call, as an integer (doubles bit-cast);
// used by the verbose path and by tests.
int64_t Actual(const Guard& g, const std::vector<c10::IValue>& args);

// "arg0.size(0) == 3", for guards(entry), explain() and WARDEN_LOGS=guards.
std::string Describe(const Guard& g, const std::vector<std::string>& names);

// The reason text of ../shared/API.md for a guard that fails on `args`, or "" if it holds.
std::string FailureReason(const Guard& g, const std::vector<c10::IValue>& args,
                          const std::vector<std::string>& names);

// True if `g` holds for `args` (reference semantics for the evaluator; slow, allocation-free).
bool Holds(const Guard& g, const std::vector<c10::IValue>& args);

// Scalar value equality as guards define it: NaN equals NaN, -0.0 differs from 0.0.
bool SameDouble(double a, double b);

}  // namespace warden::guards

#endif  // WARDEN_GUARDS_GUARD_H_
