// The op registry: per ATen op (keyed by "aten::name.overload") a shape rule, flags about purity
// and randomness, and how the replay backend calls it. Rules are registered per op family in
// ops/*.cc (alwayslink). Mutation and view aliasing are read from the op's schema, not stored here.
#ifndef WARDEN_OPS_REGISTRY_H_
#define WARDEN_OPS_REGISTRY_H_

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/ivalue.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace warden::ops {

// One dimension's size. Concrete for now; the symbolic layer (tracer/sym_expr.h) replaces it with
// an expression type that supports the same arithmetic, which is why rules must compare sizes only
// through ShapeContext::RequireEqual and never with `==` directly.
using Dim = int64_t;
using Shape = std::vector<Dim>;

// What a shape rule sees of one call: the schema-ordered arguments, tensors by shape only.
class ShapeContext {
 public:
  struct Arg {
    enum class Kind { kTensor, kTensorList, kNone, kConstant };
    Kind kind = Kind::kConstant;
    Shape shape;                    // kTensor
    std::vector<Shape> list;        // kTensorList (undefined list entries have an empty shape)
    c10::IValue constant;           // kConstant: ints, doubles, int lists, dtypes, ...
  };

  ShapeContext(std::string op, std::vector<Arg> args) : op_(std::move(op)), args_(std::move(args)) {}

  const std::string& op() const { return op_; }
  size_t num_args() const { return args_.size(); }
  const Arg& arg(size_t i) const { return args_.at(i); }
  bool is_tensor(size_t i) const { return i < args_.size() && args_[i].kind == Arg::Kind::kTensor; }
  bool is_none(size_t i) const { return i >= args_.size() || args_[i].kind == Arg::Kind::kNone; }
  const Shape& shape(size_t i) const;                 // requires is_tensor(i)
  const std::vector<Shape>& shapes(size_t i) const;   // requires a tensor list
  int64_t Int(size_t i) const;                        // constant int argument
  std::vector<int64_t> Ints(size_t i) const;          // constant int[] argument (or a single int)
  bool Bool(size_t i) const;

  // Records that the op needs a == b (broadcast, inner dims of matmul, ...). With concrete sizes
  // this checks; symbolic sizes turn it into a guard with `why` as provenance.
  absl::Status RequireEqual(Dim a, Dim b, absl::string_view why) const;

 private:
  std::string op_;
  std::vector<Arg> args_;
};

// Output shapes, one per tensor the op returns (a Tensor[] return contributes one per element).
using ShapeRule = std::function<absl::StatusOr<std::vector<Shape>>(const ShapeContext&)>;

struct OpInfo {
  std::string name;       // "aten::add.Tensor"
  ShapeRule shape;
  bool random = false;    // draws from a generator: replay draws again (like eager), never folded
  bool factory = false;   // creates a tensor from sizes; dtype may come from the default dtype
  bool data_dependent_shape = false;  // nonzero, masked_select: output size depends on values
};

class Registry {
 public:
  static Registry& Global();

  void Add(OpInfo info);
  // nullptr when the op has no rule (the tracer then decomposes or records it as opaque).
  const OpInfo* Find(absl::string_view name) const;
  std::vector<std::string> Names() const;

 private:
  std::unordered_map<std::string, OpInfo> ops_;
};

// Registers a family of ops at static-initialization time:
//   WARDEN_REGISTER_OPS(pointwise) { r.Add({...}); }
#define WARDEN_REGISTER_OPS(family)                                          \
  static void WardenRegister_##family(::warden::ops::Registry& r);           \
  static const bool warden_registered_##family = [] {                        \
    WardenRegister_##family(::warden::ops::Registry::Global());              \
    return true;                                                             \
  }();                                                                       \
  static void WardenRegister_##family(::warden::ops::Registry& r)

// --- Helpers shared by the op families -------------------------------------------------------

// Wraps a possibly negative dim into [0, rank) (rank 0 accepts -1 and 0 like ATen).
absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t rank, absl::string_view op);

// Broadcast two shapes as ATen does; a pair of sizes that is neither equal nor 1 is required
// equal (and fails with concrete sizes).
absl::StatusOr<Shape> Broadcast(const ShapeContext& ctx, const Shape& a, const Shape& b);

// The rule "output has the shape of argument i".
ShapeRule SameAs(size_t i);
// The rule "output is the broadcast of every tensor argument".
ShapeRule BroadcastAll();

}  // namespace warden::ops

#endif  // WARDEN_OPS_REGISTRY_H_
