// The op registry: per ATen op (keyed by "aten::name.overload") a shape rule, flags about purity
// and randomness, and how the replay backend calls it. Rules are registered per op family in
// ops/*.cc (alwayslink). Mutation and view aliasing are read from the op's schema, not stored here.
#ifndef WARDEN_OPS_REGISTRY_H_
#define WARDEN_OPS_REGISTRY_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/ivalue.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tracer/sym_expr.h"

namespace warden::ops {

// One dimension's size: a canonical polynomial over size symbols (tracer/sym_expr.h); concrete
// sizes are constant expressions. Rules compare sizes only through ShapeContext::RequireEqual and
// the size predicates below (Note [Size predicates]), never with `==` or `<` directly, so that a
// symbolic size turns each comparison into a guard instead of silently assuming an answer.
using Dim = tracer::SymExpr;
using Shape = std::vector<Dim>;

Shape ToShape(const std::vector<int64_t>& sizes);
// The concrete sizes of a shape whose every dim is constant (nullopt otherwise).
std::optional<std::vector<int64_t>> ConcreteShape(const Shape& shape);

// What a symbolic shape pass learns from the rules it runs: requirements (a == b) that become
// relational guards, and symbols the rules needed concrete answers about (specializations).
struct SymbolicFacts {
  struct Requirement {
    Dim lhs, rhs;
    std::string why;
  };
  std::vector<Requirement> requirements;
  std::map<int, std::string> specialized;       // symbol -> why it had to become static
  std::function<int64_t(const Dim&)> evaluate;  // the trace-time value of an expression
};

// What a shape rule sees of one call: the schema-ordered arguments, tensors by shape only.
class ShapeContext {
 public:
  struct Arg {
    enum class Kind { kTensor, kTensorList, kNone, kConstant };
    Kind kind = Kind::kConstant;
    Shape shape;                    // kTensor
    std::vector<Shape> list;        // kTensorList (undefined list entries have an empty shape)
    c10::IValue constant;           // kConstant: ints, doubles, int lists, dtypes, ...
    // kConstant int / int[] with elements that are argument sizes at run time (tracer::SizeRef):
    // every element as a Dim, those elements symbolic. Empty otherwise.
    std::vector<Dim> dims;
  };

  ShapeContext(std::string op, std::vector<Arg> args, SymbolicFacts* facts = nullptr)
      : op_(std::move(op)), args_(std::move(args)), facts_(facts) {}

  const std::string& op() const { return op_; }
  size_t num_args() const { return args_.size(); }
  const Arg& arg(size_t i) const {  // its constant as traced: taken as integers
    Took(i, kTakenAsInts);
    return args_.at(i);
  }
  bool is_tensor(size_t i) const { return i < args_.size() && args_[i].kind == Arg::Kind::kTensor; }
  bool is_none(size_t i) const { return i >= args_.size() || args_[i].kind == Arg::Kind::kNone; }
  const Shape& shape(size_t i) const;                 // requires is_tensor(i)
  const std::vector<Shape>& shapes(size_t i) const;   // requires a tensor list
  int64_t Int(size_t i) const;                        // constant int argument
  std::vector<int64_t> Ints(size_t i) const;          // constant int[] argument (or a single int)
  // The same as sizes: symbolic where an element is an argument size read at run time. Rules that
  // take sizes (view, reshape, expand, factories) read them through this, so such a graph keeps
  // its symbols; rules that use Ints() see the traced values (and the shape pass then finds
  // their result static where it should not be: Note [Verified size reads] checks for that).
  std::vector<Dim> Dims(size_t i) const;
  bool Bool(size_t i) const;
  // Whether the rule took argument i as sizes (Dims) and never as traced integers (Int, Ints,
  // Bool): only then can symbolic elements of it become run-time sizes (Note [Symbolic sizes]).
  bool TakenOnlyAsSizes(size_t i) const {
    return i < taken_.size() && taken_[i] == kTakenAsSizes;
  }

  // Records that the op needs a == b (broadcast, inner dims of matmul, ...). With concrete sizes
  // this checks; symbolic sizes turn it into a guard with `why` as provenance.
  absl::Status RequireEqual(Dim a, Dim b, absl::string_view why) const;

  // Symbolic shapes only (null for concrete ones): where requirements and specializations go.
  SymbolicFacts* facts() const { return facts_; }

 private:
  enum : uint8_t { kTakenAsSizes = 1, kTakenAsInts = 2 };
  std::vector<int64_t> IntsOf(size_t i) const;  // Ints without marking
  void Took(size_t i, uint8_t how) const {
    if (taken_.size() < args_.size()) taken_.resize(args_.size(), 0);
    if (i < taken_.size()) taken_[i] |= how;
  }

  std::string op_;
  std::vector<Arg> args_;
  SymbolicFacts* facts_ = nullptr;
  mutable std::vector<uint8_t> taken_;
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

// What the shape rule of a data_dependent_shape op returns for a size that depends on values
// (nonzero's row count): the tracer takes the real size from the eager run and guards on it.
inline const Dim kDataDependentSize = Dim(-1);

class Registry {
 public:
  static Registry& Global();

  void Add(OpInfo info);
  // nullptr when the op has no rule (the tracer then decomposes or records it as opaque).
  const OpInfo* Find(absl::string_view name) const;
  std::vector<std::string> Names() const;
  // Ops with a rule that this LibTorch does not have (not registered).
  std::vector<std::string> Absent() const;

 private:
  std::unordered_map<std::string, OpInfo> ops_;
  std::vector<std::string> absent_;
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
// The rule of an in-place pointwise op: the output is argument 0, and every other tensor argument
// must broadcast into it without growing it (ATen rejects `a.add_(b)` when a's shape would change).
ShapeRule InPlaceBroadcast();

// An error for a call the op rejects; like RequireEqual's, the message starts with the op name.
// Message text of one part: sizes print as expressions, everything else as absl::StrCat would.
inline std::string ShapeText(const Dim& d) { return d.ToString(); }
template <typename T>
const T& ShapeText(const T& v) { return v; }

template <typename... Parts>
absl::Status ShapeError(const ShapeContext& ctx, const Parts&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(ctx.op(), ": ", ShapeText(parts)...));
}

// Requires `from` to expand to exactly `to` (size-1 and missing leading dims stretch, nothing
// else changes): in-place broadcasting, addmm's self, linear's bias, copy_'s source.
absl::Status RequireExpandable(const ShapeContext& ctx, const Shape& from, const Shape& to,
                               absl::string_view why);
// Requires two shapes to be identical (same rank, every size equal).
absl::Status RequireSameShape(const ShapeContext& ctx, const Shape& a, const Shape& b,
                              absl::string_view why);

// Number of elements (the empty shape has one).
Dim Numel(const Shape& shape);

// Note [Size predicates]
// Some rules must branch on a size, not just relate two sizes: squeeze drops size-1 dims, slice
// clamps its bounds to the size, cat skips legacy empty tensors, unbind returns size(dim) tensors.
// They ask through these functions instead of comparing Dims themselves. With concrete Dims they
// just compare; the symbolic layer must record each answer as a guard (like Dynamo's guards on
// `s0 < 8`), with `why` as provenance, so that every branch a rule took stays valid on a cache hit.
// Comparisons with 0 and 1 are free there: those sizes are always specialized (API.md).
bool SizeEquals(const ShapeContext& ctx, Dim a, Dim b, absl::string_view why);
bool SizeLess(const ShapeContext& ctx, Dim a, Dim b, absl::string_view why);
// The exact value of a size that decides the structure of the result (how many tensors unbind or
// split return); symbolically this is an equality guard.
int64_t SpecializeSize(const ShapeContext& ctx, Dim d, absl::string_view why);
// a / b rounded down (sizes are non-negative): exact symbolically when it can be, otherwise the
// operands are specialized.
Dim DivFloor(const ShapeContext& ctx, const Dim& a, const Dim& b, absl::string_view why);
// A constant size (from an int[] argument) compared with a literal; symbolic sizes never are.
inline bool ConstantBelow(const Dim& d, int64_t v) { return d.is_constant() && d.constant() < v; }

// A constant Scalar argument (int, double or bool) as a double; 0 for anything else.
double ScalarArg(const ShapeContext& ctx, size_t i);

}  // namespace warden::ops

#endif  // WARDEN_OPS_REGISTRY_H_
