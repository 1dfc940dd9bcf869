// Note [Capture]
// Every tensor argument is replaced by a WrapperImpl: a storage-less TensorImpl whose key set is
// the real tensor's plus DispatchKey::DeferredInit, a functionality key above Autograd that stock
// LibTorch registers nothing on. One boxed fallback on that key sees every op that touches a
// wrapper (and, because the key is also included in TLS during the trace, every factory op). The
// fallback then either
//   - decomposes the op (no rule, but a CompositeImplicitAutograd kernel): the composite kernel
//     runs on the wrappers and its inner ops come back here;
//   - or records a node and runs the op on the real tensors with DeferredInit excluded, wrapping
//     the results.
// Wrappers use SizesStridesPolicy::CustomSizes, so sizes/strides reads by user code or composite
// kernels go through WrapperImpl and are recorded as specializations (MetadataRead). Warden itself
// never reads metadata through a wrapper: it unwraps first.
#include "tracer/tracer.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include <ATen/Functions.h>
#include <ATen/core/stack.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include "absl/strings/str_cat.h"
#include "ops/derivatives.h"
#include "ops/registry.h"
#include "tracer/error.h"
#include "tracer/torch_compat.h"

#if WARDEN_TORCH_AT_LEAST(2, 8)
#include <c10/core/SymBool.h>
#include <c10/core/SymFloat.h>
#include <c10/core/SymInt.h>
#include <c10/core/SymNodeImpl.h>
#endif

namespace warden::tracer {
namespace {

constexpr c10::DispatchKey kTraceKey = c10::DispatchKey::DeferredInit;

std::atomic<uint64_t> next_trace_id{1};

// What owns an autograd node: std::shared_ptr up to LibTorch 2.12, c10::intrusive_ptr from 2.13 on.
using NodePtr = decltype(torch::autograd::Edge::function);

struct TraceState {
  const uint64_t id = next_trace_id.fetch_add(1);
  std::shared_ptr<Graph> graph = std::make_shared<Graph>();
  std::unordered_map<const c10::TensorImpl*, ValueId> constants;
  std::map<std::tuple<ValueId, int, int>, MetadataRead> reads;
  std::vector<std::string> composite_stack;
  std::string untraceable;
  std::vector<std::string> rule_mismatches;
  // A write to an argument or captured constant, or a random draw: something a later abort of
  // the artifact could not undo. Writes to fresh intermediates (torch::tensor's fill_) are not.
  bool side_effect_seen = false;
  bool observable_write = false;  // the subset that writes arguments or constants
  bool finished = false;
  ThreadMode entry_mode;  // Note [Thread modes]
  // Note [Autograd inside the trace]
  int backward_depth = 0;        // > 0 while autograd's engine runs a backward node on this thread
  bool backward_seen = false;
  std::string abort_reason;      // non-empty: the trace is abandoned; the call re-runs eagerly
  bool syncing = false;          // replaying a requires_grad_ the function made on a wrapper
  std::vector<at::Tensor> arg_wrappers;  // the wrappers of the tensor arguments
  bool verification = false;     // Trace(..., verification): no observable effect may run
  const std::map<int, c10::IValue>* scalar_overrides = nullptr;  // verification only
  std::vector<NodePtr> keep_alive;  // accumulators shared with wrappers, mapped grad_fns
  // Note [Captured gradients]: the value behind each autograd edge a traced tensor carries (the
  // first one: a later value with the same edge is the same autograd variable, returned as itself
  // by an op such as to(its own dtype) or contiguous(); the gradient must be taken at the first,
  // whose uses include the later one's through that op's identity rule), the real tensors of values made while grad mode was on (what a derivative rule
  // may read), the forward nodes a gradient without retain_graph went through, and the forward
  // node whose rule is running (-1: none).
  std::map<std::pair<const torch::autograd::Node*, uint32_t>, ValueId> edge_values;
  std::unordered_map<ValueId, at::Tensor> reals;
  std::set<int> released;
  int grad_of = -1;
  bool gradient_result = false;  // recording the detach that ends a captured gradient
  // Note [Outside history]: the arguments and captured tensors that came in with autograd history
  // of their own (require grad, not leaves), and what to call them.
  std::map<ValueId, std::string> outside_history;
  // Note [Symbolic sizes]: hand out symbolic sizes (off in an attempt retaken with plain sizes).
  bool symbolic_sizes = true;
  bool symbolic_handed_out = false;
  std::map<std::pair<ValueId, int>, int> leaf_index;

  int Leaf(ValueId id, int dim) {
    auto [it, added] = leaf_index.emplace(std::make_pair(id, dim), static_cast<int>(graph->sym_leaves.size()));
    if (added) graph->sym_leaves.push_back({id, dim});
    return it->second;
  }
  std::string By() const {
    return composite_stack.empty() ? "user code" : absl::StrCat(composite_stack.back(), " (composite)");
  }

  void OnRead(ValueId id, MetadataRead::What what, int dim = -1) {
    if (finished) return;
    auto key = std::make_tuple(id, static_cast<int>(what), dim);
    if (reads.count(key)) return;
    MetadataRead r;
    r.value = id;
    r.what = what;
    r.dim = dim;
    r.by = By();
    reads.emplace(key, std::move(r));
  }
};

thread_local TraceState* current_state = nullptr;

#if WARDEN_TORCH_AT_LEAST(2, 8)
// Note [Symbolic sizes]
// From LibTorch 2.8 on (the SymNodeImpl interface this was written against), sym_sizes(),
// sym_size(d) and sym_numel() of a traced tensor answer with SymInts whose node is a SymSize: an
// expression over size leaves (graph.h; leaf k is "dim d of value v") with the value seen at trace
// time. Composite kernels of 2.x and C++ written with sym_size() compute with them:
//   - + - * and exact division stay expressions (SymExpr, over leaves); an op argument built from
//     them is recorded as a SymElem, which the shape pass evaluates in the size symbols, so
//     `view(x, [x.sym_size(0), -1])` follows the batch size instead of specializing it;
//   - a comparison becomes a SymCheck (the answer C++ got): decided by algebra when the difference
//     is constant, otherwise it becomes a guard (== that held) or specializes its sizes, in the
//     shape pass, with who made it;
//   - anything else that needs the number (guard_int, a non-exact division, a float, a node this
//     trace does not own) records an ordinary size read of every leaf involved: what a plain
//     sizes() read records, so nothing is assumed that is not guarded.
// An op argument computed from symbolic sizes becomes a run-time size only where the op's shape
// rule takes it as sizes (ShapeContext::Dims) and it is k * one size symbol; otherwise its sizes
// specialize. Sizes 0 and 1 are plain ints, read (an intermediate's 1 may be an expression).
// Kernels that cannot take a symbolic SymInt (an IntArrayRef kernel behind a SymInt[] schema
// unpacks it with asIntArrayRefSlow and throws) are retried with the values concretized, see
// Fallback; any error escaping the function while symbolic sizes are out retakes the whole trace
// with plain sizes (an error eager raises too is raised by that attempt). Sizes are handed out
// symbolically only until the first write to an argument or captured tensor (the point after
// which the function could not run again); after it, a symbolic value asked for its number gives
// it, read. Before 2.8 every read is a plain read.
class SymSize final : public c10::SymNodeImpl {
 public:
  enum class Kind : uint8_t { kInt, kBool, kFloat };

  SymSize(uint64_t trace_id, SymExpr expr, int64_t hint)
      : trace_id_(trace_id), kind_(Kind::kInt), expr_(std::move(expr)), hint_(hint) {}
  static c10::intrusive_ptr<SymSize> Bool(uint64_t trace_id, bool value) {
    auto n = c10::make_intrusive<SymSize>(trace_id, SymExpr(0), value ? 1 : 0);
    n->kind_ = Kind::kBool;
    return n;
  }
  static c10::intrusive_ptr<SymSize> Float(uint64_t trace_id, double value) {
    auto n = c10::make_intrusive<SymSize>(trace_id, SymExpr(0), 0);
    n->kind_ = Kind::kFloat;
    n->float_ = value;
    return n;
  }
  static c10::intrusive_ptr<SymSize> Check(uint64_t trace_id, SymCheck::Op op, SymExpr lhs, SymExpr rhs,
                                           bool result) {
    auto n = c10::make_intrusive<SymSize>(trace_id, SymExpr(0), result ? 1 : 0);
    n->kind_ = Kind::kBool;
    n->check_ = true;
    n->op_ = op;
    n->expr_ = std::move(lhs);
    n->rhs_ = std::move(rhs);
    return n;
  }

  bool is_int() override { return kind_ == Kind::kInt; }
  bool is_bool() override { return kind_ == Kind::kBool; }
  bool is_float() override { return kind_ == Kind::kFloat; }
  bool is_symbolic() override { return !Constant(); }
  bool is_constant() override { return Constant(); }
  bool has_hint() override { return true; }

  c10::SymNode add(const c10::SymNode& other) override { return Arith(other, '+'); }
  c10::SymNode sub(const c10::SymNode& other) override { return Arith(other, '-'); }
  c10::SymNode mul(const c10::SymNode& other) override { return Arith(other, '*'); }
  c10::SymNode floordiv(const c10::SymNode& other) override { return Divide(other, /*mod=*/false); }
  c10::SymNode int_floordiv(const c10::SymNode& other) override { return Divide(other, /*mod=*/false); }
  c10::SymNode mod(const c10::SymNode& other) override { return Divide(other, /*mod=*/true); }
  c10::SymNode neg() override { return Make(-expr_, -hint_); }
  c10::SymNode eq(const c10::SymNode& other) override { return Compare(other, SymCheck::Op::kEq); }
  c10::SymNode ne(const c10::SymNode& other) override { return Compare(other, SymCheck::Op::kNe); }
  c10::SymNode lt(const c10::SymNode& other) override { return Compare(other, SymCheck::Op::kLt); }
  c10::SymNode le(const c10::SymNode& other) override { return Compare(other, SymCheck::Op::kLe); }
  c10::SymNode gt(const c10::SymNode& other) override { return Compare(other, SymCheck::Op::kGt); }
  c10::SymNode ge(const c10::SymNode& other) override { return Compare(other, SymCheck::Op::kGe); }
  c10::SymNode sym_min(const c10::SymNode& other) override { return MinMax(other, /*max=*/false); }
  c10::SymNode sym_max(const c10::SymNode& other) override { return MinMax(other, /*max=*/true); }
  c10::SymNode sym_and(const c10::SymNode& other) override {
    return Bool(trace_id_, Truth() && Of(other)->Truth());
  }
  c10::SymNode sym_or(const c10::SymNode& other) override {
    return Bool(trace_id_, Truth() || Of(other)->Truth());
  }
  c10::SymNode sym_not() override { return Bool(trace_id_, !Truth()); }
  c10::SymNode sym_ite(const c10::SymNode& then_val, const c10::SymNode& else_val) override {
    return Truth() ? then_val : else_val;
  }
  // Everything with floats needs the numbers.
  c10::SymNode sym_float() override { return Float(trace_id_, AsDouble()); }
  c10::SymNode truediv(const c10::SymNode& other) override { return Float(trace_id_, AsDouble() / Of(other)->AsDouble()); }
  c10::SymNode float_truediv(const c10::SymNode& other) override { return truediv(other); }
  c10::SymNode int_truediv(const c10::SymNode& other) override { return truediv(other); }
  c10::SymNode pow(const c10::SymNode& other) override { return Float(trace_id_, std::pow(AsDouble(), Of(other)->AsDouble())); }
  c10::SymNode float_pow(const c10::SymNode& other) override { return pow(other); }
  c10::SymNode pow_by_natural(const c10::SymNode& other) override {
    int64_t r = 1;
    const int64_t base = Concrete(), e = Of(other)->Concrete();
    for (int64_t i = 0; i < e; ++i) r *= base;
    return Make(SymExpr(r), r);
  }
  c10::SymNode ceil() override {
    if (kind_ != Kind::kFloat) return c10::SymNode(c10::intrusive_ptr<SymSize>::reclaim_copy(this));
    const double v = std::ceil(float_);
    return Make(SymExpr(static_cast<int64_t>(v)), static_cast<int64_t>(v));
  }
  c10::SymNode floor() override {
    if (kind_ != Kind::kFloat) return c10::SymNode(c10::intrusive_ptr<SymSize>::reclaim_copy(this));
    const double v = std::floor(float_);
    return Make(SymExpr(static_cast<int64_t>(v)), static_cast<int64_t>(v));
  }
  c10::SymNode clone() override { return c10::SymNode(c10::intrusive_ptr<SymSize>::reclaim_copy(this)); }
  c10::SymNode wrap_int(int64_t num) override { return Make(SymExpr(num), num); }
  c10::SymNode wrap_bool(bool num) override { return Bool(trace_id_, num); }
  c10::SymNode wrap_float(double num) override { return Float(trace_id_, num); }

  int64_t guard_int(const char*, int64_t) override { return Concrete(); }
  int64_t int_() override { return Concrete(); }
  double guard_float(const char*, int64_t) override { return AsDouble(); }
  bool guard_bool(const char*, int64_t) override { return Truth(); }
  bool bool_() override { return Truth(); }
  bool expect_true(const char*, int64_t) override { return Truth(); }
  bool guard_size_oblivious(const char*, int64_t) override { return Truth(); }
  std::optional<int64_t> constant_int() override {
    if (kind_ == Kind::kInt && expr_.is_constant()) return expr_.constant();
    return std::nullopt;
  }
  std::optional<bool> constant_bool() override {
    if (kind_ == Kind::kBool && !check_) return hint_ != 0;
    return std::nullopt;
  }
  // After an observable write a refusal could no longer be retried (Trace): the number, read.
  std::optional<int64_t> maybe_as_int() override {
    if (auto c = constant_int()) return c;
    TraceState* st = State();
    if (kind_ == Kind::kInt && st != nullptr && st->observable_write) return Concrete();
    return std::nullopt;
  }
  std::string str() override {
    if (kind_ == Kind::kFloat) return absl::StrCat(float_);
    return absl::StrCat(expr_.ToString(), " (traced ", hint_, ")");
  }

  // The expression and traced value of a SymInt this trace owns (false otherwise).
  static bool Unpack(const c10::SymInt& v, SymExpr* expr, int64_t* hint) {
    if (!v.is_heap_allocated()) {
      *expr = SymExpr(v.as_int_unchecked());
      *hint = v.as_int_unchecked();
      return true;
    }
    auto* n = dynamic_cast<SymSize*>(v.toSymNodeImplUnowned());
    if (n == nullptr || n->kind_ != Kind::kInt || n->State() == nullptr) return false;
    *expr = n->expr_;
    *hint = n->hint_;
    return true;
  }
  // The plain int a kernel needs instead of `v`: what guard_int() does (records the reads).
  static int64_t ConcreteOf(const c10::SymInt& v) { return v.guard_int(__FILE__, __LINE__); }

 private:
  TraceState* State() const {
    return current_state != nullptr && current_state->id == trace_id_ ? current_state : nullptr;
  }
  bool Constant() const {
    if (kind_ == Kind::kFloat) return true;
    if (kind_ == Kind::kBool) return !check_;
    return expr_.is_constant();
  }
  c10::SymNode Make(SymExpr e, int64_t hint) const { return c10::make_intrusive<SymSize>(trace_id_, std::move(e), hint); }

  // `other` as one of this trace's nodes; a foreign node is concretized first (its own guard_int).
  c10::intrusive_ptr<SymSize> Of(const c10::SymNode& other) const {
    if (auto* n = dynamic_cast<SymSize*>(other.get()); n != nullptr && n->trace_id_ == trace_id_) {
      return c10::intrusive_ptr<SymSize>::reclaim_copy(n);
    }
    if (other->is_bool()) return Bool(trace_id_, other->guard_bool(__FILE__, __LINE__));
    if (other->is_float()) return Float(trace_id_, other->guard_float(__FILE__, __LINE__));
    const int64_t v = other->guard_int(__FILE__, __LINE__);
    return c10::make_intrusive<SymSize>(trace_id_, SymExpr(v), v);
  }

  // The traced value, with every leaf recorded as a size read.
  int64_t Concrete() {
    if (kind_ == Kind::kFloat) return static_cast<int64_t>(float_);
    if (kind_ == Kind::kBool) return Truth() ? 1 : 0;
    ReadLeaves(expr_);
    return hint_;
  }
  double AsDouble() { return kind_ == Kind::kFloat ? float_ : static_cast<double>(Concrete()); }
  void ReadLeaves(const SymExpr& e) const {
    TraceState* st = State();
    if (st == nullptr) return;
    for (int k : e.symbols()) {
      const SymLeaf& leaf = st->graph->sym_leaves.at(k);
      st->OnRead(leaf.value, MetadataRead::What::kSizes, leaf.dim);
    }
  }
  // The answer of a bool; a comparison is recorded as a SymCheck the first time it is asked.
  bool Truth() {
    if (kind_ == Kind::kInt) return Concrete() != 0;
    if (kind_ == Kind::kFloat) return float_ != 0;
    if (check_ && !recorded_) {
      recorded_ = true;
      if (TraceState* st = State()) {
        SymCheck c;
        c.op = op_;
        c.lhs = expr_;
        c.rhs = rhs_;
        c.result = hint_ != 0;
        c.by = st->By();
        if (std::find(st->graph->sym_checks.begin(), st->graph->sym_checks.end(), c) == st->graph->sym_checks.end()) {
          st->graph->sym_checks.push_back(std::move(c));
        }
      }
    }
    return hint_ != 0;
  }

  c10::SymNode Arith(const c10::SymNode& other, char op) {
    auto o = Of(other);
    if (kind_ == Kind::kFloat || o->kind_ == Kind::kFloat) {
      const double a = AsDouble(), b = o->AsDouble();
      return Float(trace_id_, op == '+' ? a + b : op == '-' ? a - b : a * b);
    }
    if (kind_ == Kind::kBool || o->kind_ == Kind::kBool) {
      const int64_t a = Concrete(), b = o->Concrete();
      const int64_t v = op == '+' ? a + b : op == '-' ? a - b : a * b;
      return Make(SymExpr(v), v);
    }
    switch (op) {
      case '+': return Make(expr_ + o->expr_, hint_ + o->hint_);
      case '-': return Make(expr_ - o->expr_, hint_ - o->hint_);
      default: return Make(expr_ * o->expr_, hint_ * o->hint_);
    }
  }
  // Floor division and modulo: an expression when the division is exact for every value of the
  // leaves (then the remainder is 0), else the numbers.
  c10::SymNode Divide(const c10::SymNode& other, bool mod) {
    auto o = Of(other);
    if (kind_ == Kind::kInt && o->kind_ == Kind::kInt && o->hint_ != 0) {
      if (auto q = SymExpr::ExactDiv(expr_, o->expr_)) {
        if (mod) return Make(SymExpr(0), 0);
        return Make(*q, hint_ / o->hint_);
      }
    }
    const int64_t a = Concrete(), b = o->Concrete();
    if (b == 0) return Make(SymExpr(0), 0);  // ATen checks before it divides; no value to give
    int64_t q = a / b, r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) {  // floor semantics
      q -= 1;
      r += b;
    }
    return mod ? Make(SymExpr(r), r) : Make(SymExpr(q), q);
  }
  c10::SymNode Compare(const c10::SymNode& other, SymCheck::Op op) {
    auto o = Of(other);
    if (kind_ != Kind::kInt || o->kind_ != Kind::kInt) {
      const double a = AsDouble(), b = o->AsDouble();
      return Bool(trace_id_, Holds(op, a, b));
    }
    const bool result = Holds(op, hint_, o->hint_);
    const SymExpr diff = expr_ - o->expr_;
    if (diff.is_constant()) return Bool(trace_id_, result);  // decided by algebra: no guard
    return Check(trace_id_, op, expr_, o->expr_, result);
  }
  c10::SymNode MinMax(const c10::SymNode& other, bool max) {
    auto o = Of(other);
    if (kind_ != Kind::kInt || o->kind_ != Kind::kInt) {
      const double a = AsDouble(), b = o->AsDouble();
      return Float(trace_id_, max ? std::max(a, b) : std::min(a, b));
    }
    // Which one it is, as a comparison C++ made.
    const bool first = Compare(other, max ? SymCheck::Op::kGe : SymCheck::Op::kLe)->guard_bool(__FILE__, __LINE__);
    return first ? c10::SymNode(c10::intrusive_ptr<SymSize>::reclaim_copy(this)) : c10::SymNode(o);
  }
  template <typename T>
  static bool Holds(SymCheck::Op op, T a, T b) {
    switch (op) {
      case SymCheck::Op::kEq: return a == b;
      case SymCheck::Op::kNe: return a != b;
      case SymCheck::Op::kLt: return a < b;
      case SymCheck::Op::kLe: return a <= b;
      case SymCheck::Op::kGt: return a > b;
      case SymCheck::Op::kGe: return a >= b;
    }
    return false;
  }

  uint64_t trace_id_;
  Kind kind_;
  SymExpr expr_;  // kInt: the value; a check: its lhs
  SymExpr rhs_;   // a check: its rhs
  int64_t hint_;  // kInt: the traced value; kBool: the answer
  double float_ = 0;
  bool check_ = false;
  bool recorded_ = false;
  SymCheck::Op op_ = SymCheck::Op::kEq;
};
#endif  // WARDEN_TORCH_AT_LEAST(2, 8)

class WrapperImpl final : public c10::TensorImpl {
 public:
  WrapperImpl(at::Tensor real, uint64_t trace_id, ValueId id)
      : c10::TensorImpl(real.key_set() | c10::DispatchKeySet(kTraceKey), real.dtype(),
                        real.device()),
        real_(std::move(real)),
        trace_id_(trace_id),
        id_(id) {
    // TensorImpl's constructor derives the autograd keys from the current InferenceMode; a wrapper
    // must be an inference tensor exactly when its real tensor is (is_inference(), and the checks
    // requires_grad_() and in-place ops make on it, read the key set).
    key_set_ = real_.key_set() | c10::DispatchKeySet(kTraceKey);
    set_sizes_and_strides(real_.sizes(), real_.strides());
    set_storage_access_should_throw();
    set_custom_sizes_strides(SizesStridesPolicy::CustomSizes);
  }

  const at::Tensor& real() const { return real_; }
  ValueId id() const { return id_; }
  void set_id(ValueId id) { id_ = id; }
  // The real tensor's grad_fn that MirrorAutograd gave this wrapper (Note [Autograd inside the
  // trace]); any other grad_fn on the wrapper was set by C++ autograd code the trace cannot see.
  const torch::autograd::Node* mirrored() const { return mirrored_; }
  void set_mirrored(const torch::autograd::Node* node) { mirrored_ = node; }
  // The trace this wrapper belongs to if that trace is the one running on this thread, else null
  // (the wrapper escaped its trace; its state may be gone, so it is never dereferenced then).
  TraceState* live_state() const {
    return current_state != nullptr && current_state->id == trace_id_ ? current_state : nullptr;
  }

  c10::IntArrayRef sizes_custom() const override {
    Read(MetadataRead::What::kSizes);
    return real_.sizes();
  }
  c10::SymIntArrayRef sym_sizes_custom() const override {
    if (const std::vector<c10::SymInt>* s = SymbolicSizes()) return *s;
    Read(MetadataRead::What::kSizes);
    return real_.sym_sizes();
  }
  int64_t dim_custom() const override {
    Read(MetadataRead::What::kRank);
    return real_.dim();
  }
  int64_t size_custom(int64_t d) const override {
    ReadDim(d);
    return real_.size(d);
  }
  c10::SymInt sym_size_custom(int64_t d) const override {
    if (const std::vector<c10::SymInt>* s = SymbolicSizes()) {
      const int64_t rank = static_cast<int64_t>(s->size());
      const int64_t k = d < 0 ? d + rank : d;
      if (k >= 0 && k < rank) return (*s)[k];
    }
    ReadDim(d);
    return real_.sym_size(d);
  }
  int64_t numel_custom() const override {
    Read(MetadataRead::What::kSizes);
    return real_.numel();
  }
  c10::SymInt sym_numel_custom() const override {
    if (const std::vector<c10::SymInt>* s = SymbolicSizes()) {
      c10::SymInt n = 1;
      for (const c10::SymInt& e : *s) n = n * e;
      return n;
    }
    Read(MetadataRead::What::kSizes);
    return real_.sym_numel();
  }
  c10::IntArrayRef strides_custom() const override {
    Read(MetadataRead::What::kStrides);
    return real_.strides();
  }
  c10::SymIntArrayRef sym_strides_custom() const override {
    Read(MetadataRead::What::kStrides);
    return real_.sym_strides();
  }
  int64_t storage_offset_custom() const override {
    Read(MetadataRead::What::kStrides);
    return real_.storage_offset();
  }
  c10::SymInt sym_storage_offset_custom() const override {
    Read(MetadataRead::What::kStrides);
    return c10::SymInt(real_.storage_offset());
  }
  // From LibTorch 2.8 on, is_contiguous() and is_non_overlapping_and_dense() reach a wrapper only
  // through the SymBool virtuals; overriding the old names there would not compile (they are no
  // longer virtual), and a wrapper without these overrides would answer from stored metadata
  // without recording the read, i.e. lose guards (Note [Which LibTorch]).
#if WARDEN_TORCH_AT_LEAST(2, 8)
  c10::SymBool sym_is_contiguous_custom(at::MemoryFormat format) const override {
    Read(MetadataRead::What::kStrides);
    return c10::SymBool(real_.is_contiguous(format));
  }
  c10::SymBool sym_is_non_overlapping_and_dense_custom() const override {
    Read(MetadataRead::What::kStrides);
    return c10::SymBool(real_.is_non_overlapping_and_dense());
  }
#else
  bool is_contiguous_custom(at::MemoryFormat format) const override {
    Read(MetadataRead::What::kStrides);
    return real_.is_contiguous(format);
  }
  bool is_non_overlapping_and_dense_custom() const override {
    Read(MetadataRead::What::kStrides);
    return real_.is_non_overlapping_and_dense();
  }
#endif
  bool is_strides_like_custom(at::MemoryFormat format) const override {
    Read(MetadataRead::What::kStrides);
    return real_.unsafeGetTensorImpl()->is_strides_like(format);
  }

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter,
      bool allow_tensor_metadata_change) const override {
    return c10::make_intrusive<WrapperImpl>(real_, trace_id_, id_);
  }
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const override {
    return c10::make_intrusive<WrapperImpl>(real_, trace_id_, id_);
  }
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override {
    throw Error("warden: shallow_copy_from (Tensor::set_data) on a traced tensor is not supported");
  }

 private:
  const char* tensorimpl_type_name() const override { return "warden::WrapperImpl"; }

  void Read(MetadataRead::What what) const {
    if (TraceState* st = live_state()) st->OnRead(id_, what);
  }
  // Note [Symbolic sizes]: this value's sizes as SymInts over its size leaves (sizes 0 and 1 as
  // plain ints), or null where they are not handed out (the version, an abandoned attempt, after
  // an observable write, or a wrapper whose real tensor was resized behind the trace's back).
  const std::vector<c10::SymInt>* SymbolicSizes() const {
#if WARDEN_TORCH_AT_LEAST(2, 8)
    TraceState* st = live_state();
    if (st == nullptr || !st->symbolic_sizes || st->observable_write || st->backward_depth > 0) return nullptr;
    const std::vector<int64_t>& meta = st->graph->value(id_).meta.sizes;
    if (c10::IntArrayRef(meta) != real_.sizes()) return nullptr;
    if (sym_sizes_.empty() || sym_sizes_id_ != id_) {
      auto v = std::make_unique<std::vector<c10::SymInt>>();
      for (size_t d = 0; d < meta.size(); ++d) {
        if (meta[d] < 2) {
          // 0 and 1 as plain ints, read: an input's always specialize, but an intermediate's
          // may be an expression that is 1 only at these sizes (conv's s - 2 at s = 3).
          st->OnRead(id_, MetadataRead::What::kSizes, static_cast<int>(d));
          v->emplace_back(meta[d]);
          continue;
        }
        const int leaf = st->Leaf(id_, static_cast<int>(d));
        v->emplace_back(c10::SymNode(c10::make_intrusive<SymSize>(st->id, SymExpr::Symbol(leaf), meta[d])));
      }
      st->symbolic_handed_out = true;
      // Earlier vectors stay alive: a kernel may still hold an ArrayRef into one.
      sym_sizes_.push_back(std::move(v));
      sym_sizes_id_ = id_;
    }
    return sym_sizes_.back().get();
#else
    return nullptr;
#endif
  }
  // size(d): only dim d is read (a negative d counts from the end, as ATen wraps it).
  void ReadDim(int64_t d) const {
    const int64_t rank = real_.dim();
    if (d < 0) d += rank;
    if (d < 0 || d >= rank) return;  // real_.size(d) raises ATen's error
    if (TraceState* st = live_state()) st->OnRead(id_, MetadataRead::What::kSizes, static_cast<int>(d));
  }

  at::Tensor real_;
  uint64_t trace_id_;
  ValueId id_;
  const torch::autograd::Node* mirrored_ = nullptr;
  mutable std::vector<std::unique_ptr<std::vector<c10::SymInt>>> sym_sizes_;
  mutable ValueId sym_sizes_id_ = kNoValue;
};

void AbandonForGradAccess(const WrapperImpl& w, bool write);

// The autograd metadata of every wrapper: autograd's own (grad_fn, requires_grad, accumulator:
// MirrorAutograd fills them in), except that reading a gradient a wrapper cannot have (its real
// tensor's .grad() is defined) or writing one abandons the trace (Note [Autograd inside the
// trace]): `.grad()` is not an op, so the cached graph could not follow it.
class WrapperMeta final : public torch::autograd::AutogradMeta {
 public:
  explicit WrapperMeta(const WrapperImpl* owner) : owner_(owner) {}
  at::Tensor& mutable_grad() override {
    AbandonForGradAccess(*owner_, /*write=*/true);
    return grad_;
  }
  const at::Tensor& grad() const override {
    AbandonForGradAccess(*owner_, /*write=*/false);
    return grad_;
  }
  // A view of a tensor that requires grad made under NoGradGuard requires grad through its base
  // while its own flag (the one requires_grad_() sets, and MirrorAutograd mirrors) is off; the
  // wrapper answers as its real tensor does.
  bool requires_grad() const override {
    return requires_grad_ || grad_fn_ || BaseRequiresGrad(owner_->real());
  }
  static bool BaseRequiresGrad(const at::Tensor& real) {
    const torch::autograd::DifferentiableViewMeta* view = torch::autograd::impl::get_view_autograd_meta(real);
    return view != nullptr && view->has_bw_view() && view->get_backward_view().base_.requires_grad();
  }

 private:
  const WrapperImpl* owner_;
};

WrapperImpl* AsWrapper(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->key_set().has(kTraceKey)) return nullptr;
  return static_cast<WrapperImpl*>(impl);
}

at::Tensor Wrap(const at::Tensor& real, TraceState* state, ValueId id) {
  auto impl = c10::make_intrusive<WrapperImpl>(real, state->id, id);
  impl->set_autograd_meta(std::make_unique<WrapperMeta>(impl.get()));
  return at::Tensor(std::move(impl));
}

std::string OpName(const c10::FunctionSchema& schema) {
  if (schema.overload_name().empty()) return schema.name();
  return absl::StrCat(schema.name(), ".", schema.overload_name());
}

// True if `t`'s memory is not owned by its storage (torch::from_blob without a deleter): nothing
// keeps it alive or unchanged for a replay.
bool BorrowsMemory(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->has_storage() || impl->is_wrapped_number()) return false;
  const c10::Storage& storage = impl->storage();
  // Allocators and from_blob's deleter overload hand out a context to free; no context means
  // nothing will ever be freed, i.e. the memory belongs to someone else.
  return storage.nbytes() > 0 && storage.data_ptr().get() != nullptr && storage.data_ptr().get_context() == nullptr;
}

NodePtr RealGradFn(const at::Tensor& real);

// Maps one tensor seen in a node's arguments to its value: wrappers to their value, plain tensors
// to a (deduplicated) captured constant. Returns the real tensor to run the op with.
ValueId TensorValue(TraceState& st, const at::Tensor& t, at::Tensor* real) {
  if (WrapperImpl* w = AsWrapper(t)) {
    if (w->live_state() != &st) {
      throw Error("warden: a tensor from another (finished) trace was used while tracing; "
                  "traced tensors must not escape the traced function");
    }
    *real = w->real();
    return w->id();
  }
  *real = t;
  auto it = st.constants.find(t.unsafeGetTensorImpl());
  if (it != st.constants.end()) return it->second;
  if (BorrowsMemory(t) && st.untraceable.empty()) {
    // torch::from_blob over C++ memory (an image buffer, a std::vector): the graph would hold the
    // tensor while the memory may be refilled or freed after the call, so the function runs
    // eagerly from now on. This call's results are eager's (the op ran on the real tensor).
    st.untraceable =
        "reads C++ memory through a tensor that does not own it (torch::from_blob without a deleter): "
        "pass the tensor as an argument, or give from_blob a deleter that keeps the memory alive";
  }
  Value v;
  v.kind = ValueKind::kConstant;
  v.meta = TensorMeta::Of(t);
  v.constant = t;
  ValueId id = st.graph->AddValue(std::move(v));
  st.constants.emplace(t.unsafeGetTensorImpl(), id);
  if (t.requires_grad()) {
    // A captured parameter: a gradient may be taken with respect to it (Note [Captured gradients]).
    st.reals[id] = t;
    NodePtr edge = RealGradFn(t);
    if (edge != nullptr) st.outside_history[id] = absl::StrCat("captured tensor ", st.graph->ValueName(id));
    uint32_t nr = static_cast<uint32_t>(t.output_nr());
    if (edge == nullptr) {
      edge = torch::autograd::impl::grad_accumulator(t);
      nr = 0;
    }
    if (edge != nullptr) {
      st.edge_values.emplace(std::make_pair(edge.get(), nr), id);
      st.keep_alive.push_back(std::move(edge));
    }
  }
  return id;
}

bool IsOptionalTensorList(const c10::IValue& v) {
  if (!v.isList()) return false;
  for (const c10::IValue& e : v.toListRef()) {
    if (!e.isTensor() && !e.isNone()) return false;
  }
  return v.toListRef().size() > 0;
}

// Note [Symbolic sizes]: a kernel that cannot take a symbolic SymInt refused one.
bool IsSymbolicRefusal(const c10::Error& e) {
  const std::string msg = e.what_without_backtrace();
  return msg.find("expected to contain only concrete integers") != std::string::npos ||
         msg.find("expected int but got") != std::string::npos || msg.find("NYI") != std::string::npos;
}

// Composites that refused a symbolic argument: later traces concretize their arguments first.
std::mutex refusing_mu;
std::set<std::string>& RefusingComposites() {
  static auto* ops = new std::set<std::string>();
  return *ops;
}
bool RefusesSymbolic(const std::string& op) {
  std::lock_guard<std::mutex> lock(refusing_mu);
  return RefusingComposites().count(op) > 0;
}
void AddRefusing(const std::string& op) {
  std::lock_guard<std::mutex> lock(refusing_mu);
  RefusingComposites().insert(op);
}

// Replaces symbolic SymInts (and SymFloat/SymBool) in an op argument by their traced values.
// With `elems`, elements that are expressions over this trace's size leaves are appended to it
// (Note [Symbolic sizes]); everything else is concretized as guard_int() does, with its reads.
bool HasSymbolic(const c10::IValue& iv) {
#if WARDEN_TORCH_AT_LEAST(2, 8)
  if (iv.isSymInt() || iv.isSymFloat() || iv.isSymBool()) return true;
  if (iv.isSymIntList()) {
    for (const c10::SymInt& v : iv.toSymIntList()) {
      if (v.is_heap_allocated()) return true;
    }
  }
#endif
  return false;
}
void ConcretizeSymbolic(c10::IValue& iv, std::vector<SymElem>* elems) {
#if WARDEN_TORCH_AT_LEAST(2, 8)
  if (!HasSymbolic(iv)) return;
  auto one = [&](const c10::SymInt& v, int elem) -> int64_t {
    SymExpr e;
    int64_t hint = 0;
    if (elems != nullptr && SymSize::Unpack(v, &e, &hint)) {
      if (!e.is_constant()) elems->push_back({elem, e});
      return hint;
    }
    return SymSize::ConcreteOf(v);
  };
  if (iv.isSymInt()) {
    iv = one(iv.toSymInt(), -1);
  } else if (iv.isSymFloat()) {
    iv = iv.toSymFloat().guard_float(__FILE__, __LINE__);
  } else if (iv.isSymBool()) {
    iv = iv.toSymBool().guard_bool(__FILE__, __LINE__);
  } else {
    std::vector<int64_t> ints;
    int k = 0;
    for (const c10::SymInt& v : iv.toSymIntList()) ints.push_back(one(v, k++));
    iv = c10::IValue(ints);
  }
#else
  (void)iv;
  (void)elems;
#endif
}

// Records argument `iv` into `arg` and replaces wrappers in `iv` by their real tensors.
void RecordArg(TraceState& st, c10::IValue& iv, NodeArg& arg, std::vector<ValueId>& tensor_inputs,
               std::vector<at::Tensor>& real_inputs) {
  if (iv.isTensor()) {
    const at::Tensor& t = iv.toTensor();
    if (!t.defined()) {
      arg.kind = NodeArg::Kind::kConstant;
      arg.constant = iv;
      return;
    }
    at::Tensor real;
    arg.kind = NodeArg::Kind::kValue;
    arg.value = TensorValue(st, t, &real);
    tensor_inputs.push_back(arg.value);
    real_inputs.push_back(real);
    iv = real;
    return;
  }
  if (iv.isTensorList()) {
    arg.kind = NodeArg::Kind::kValueList;
    c10::List<at::Tensor> reals;
    for (const at::Tensor& t : iv.toTensorVector()) {
      at::Tensor real;
      ValueId id = TensorValue(st, t, &real);
      arg.values.push_back(id);
      tensor_inputs.push_back(id);
      real_inputs.push_back(real);
      reals.push_back(real);
    }
    iv = reals;
    return;
  }
  if (IsOptionalTensorList(iv)) {
    arg.kind = NodeArg::Kind::kOptValueList;
    c10::List<c10::optional<at::Tensor>> reals;
    for (const c10::IValue& e : iv.toListRef()) {
      if (e.isNone() || !e.toTensor().defined()) {
        arg.values.push_back(kNoValue);
        reals.push_back(c10::nullopt);
        continue;
      }
      at::Tensor real;
      ValueId id = TensorValue(st, e.toTensor(), &real);
      arg.values.push_back(id);
      tensor_inputs.push_back(id);
      real_inputs.push_back(real);
      reals.push_back(real);
    }
    iv = reals;
    return;
  }
  arg.kind = NodeArg::Kind::kConstant;
  ConcretizeSymbolic(iv, &arg.sym_elems);
  arg.constant = iv;
}

// The input this result aliases (shares storage with), if any; the schema's alias annotations say
// the same for view and in-place ops, but storage identity also catches ops that return `self`.
ValueId AliasedInput(const at::Tensor& result, const std::vector<ValueId>& ids,
                     const std::vector<at::Tensor>& reals) {
  if (!result.defined() || !result.has_storage()) return kNoValue;
  for (size_t i = 0; i < reals.size(); ++i) {
    if (reals[i].has_storage() && result.is_alias_of(reals[i])) return ids[i];
  }
  return kNoValue;
}

ops::ShapeContext MakeShapeContext(const Graph& g, const Node& node) {
  std::vector<ops::ShapeContext::Arg> args;
  args.reserve(node.args.size());
  for (const NodeArg& a : node.args) {
    ops::ShapeContext::Arg s;
    switch (a.kind) {
      case NodeArg::Kind::kConstant:
        if (a.constant.isNone() || (a.constant.isTensor() && !a.constant.toTensor().defined())) {
          s.kind = ops::ShapeContext::Arg::Kind::kNone;
        } else {
          s.kind = ops::ShapeContext::Arg::Kind::kConstant;
          s.constant = a.constant;
        }
        break;
      case NodeArg::Kind::kValue:
        s.kind = ops::ShapeContext::Arg::Kind::kTensor;
        s.shape = ops::ToShape(g.value(a.value).meta.sizes);
        break;
      case NodeArg::Kind::kValueList:
      case NodeArg::Kind::kOptValueList:
        s.kind = ops::ShapeContext::Arg::Kind::kTensorList;
        for (ValueId id : a.values) {
          s.list.push_back(id == kNoValue ? ops::Shape{} : ops::ToShape(g.value(id).meta.sizes));
        }
        break;
    }
    args.push_back(std::move(s));
  }
  return ops::ShapeContext(node.op, std::move(args));
}

// Checks the registered rule against what ATen produced; a rule that disagrees is a Warden bug,
// and the node is then treated as opaque (its shapes specialized) rather than trusted.
void CheckRule(TraceState& st, const ops::OpInfo& info, Node& node) {
  if (!info.shape) return;
  const Graph& g = *st.graph;
  auto shapes = info.shape(MakeShapeContext(g, node));
  std::vector<std::vector<int64_t>> actual;
  for (const NodeReturn& r : node.returns) {
    if (r.kind == NodeReturn::Kind::kScalar) continue;
    for (ValueId id : r.values) actual.push_back(g.value(id).meta.sizes);
  }
  bool ok = shapes.ok() && shapes->size() == actual.size();
  for (size_t i = 0; ok && i < actual.size(); ++i) {
    if (info.data_dependent_shape) break;
    ok = ops::ConcreteShape((*shapes)[i]) == actual[i];
  }
  if (!ok) {
    node.kind = NodeKind::kOpaque;
    st.rule_mismatches.push_back(absl::StrCat(
        node.op, " at %", node.index, ": ",
        shapes.ok() ? "shape rule disagrees with ATen" : std::string(shapes.status().message())));
  }
}

// True if the node writes (schema alias annotation with '!') a value whose storage belongs to an
// argument or a captured constant.
bool WritesArgumentOrConstant(const Graph& g, const Node& node) {
  for (ValueId v : WrittenValues(node)) {
    const ValueKind root = g.value(g.RootOf(v)).kind;
    if (root == ValueKind::kInput || root == ValueKind::kConstant) return true;
  }
  return false;
}

// Note [View or copy]: reshape, flatten, reshape_as and contiguous return a view when the input's
// strides allow it and a copy otherwise. Replay makes the same choice as eager, but what an
// in-place op on the result writes (an argument, or a fresh intermediate) decides whether a later
// value guard can abort the artifact soundly and whether argument aliasing is guarded. So a write
// to a value reached through such an op reads the strides of the op's input.
void ReadStridesBehindWrite(TraceState& st, const Node& node) {
  static const auto* kViewOrCopy = new std::set<std::string>{
      "aten::reshape", "aten::flatten.using_ints", "aten::reshape_as", "aten::contiguous"};
  const Graph& g = *st.graph;
  const auto& schema = node.handle->schema();
  for (size_t i = 0; i < node.args.size() && i < schema.arguments().size(); ++i) {
    const auto* alias = schema.arguments()[i].alias_info();
    if (alias == nullptr || !alias->isWrite() || node.args[i].kind != NodeArg::Kind::kValue) continue;
    for (ValueId v = node.args[i].value; v != kNoValue; v = g.value(v).alias_of) {
      const Value& value = g.value(v);
      if (value.kind != ValueKind::kNode || value.node < 0) continue;
      const Node& producer = g.nodes[value.node];
      if (!kViewOrCopy->count(producer.op) || producer.args.empty() ||
          producer.args[0].kind != NodeArg::Kind::kValue) {
        continue;
      }
      const ValueId input = producer.args[0].value;
      auto key = std::make_tuple(input, static_cast<int>(MetadataRead::What::kStrides), -1);
      if (st.reads.count(key)) continue;
      MetadataRead r;
      r.value = input;
      r.what = MetadataRead::What::kStrides;
      r.by = absl::StrCat(producer.op, " at %", producer.index, " (view or copy, written by ", node.op,
                          " at %", node.index, ")");
      st.reads.emplace(key, std::move(r));
    }
  }
}

// ATen's errors for reading the data of a storage-less tensor (data_ptr(), accessor(), printing).
bool IsRawDataAccess(const c10::Error& e) {
  const std::string msg = e.what_without_backtrace();
  return msg.find("Cannot access data pointer of Tensor that doesn't have storage") != std::string::npos ||
         msg.find("Cannot access storage of warden::WrapperImpl") != std::string::npos;
}

// Note [Autograd inside the trace]
// Wrappers sit above Autograd: autograd records history on the real tensors, never on wrappers.
// But C++ code reads autograd state through the wrappers it holds (requires_grad(), is_leaf(),
// grad_fn()), starts backward passes from them (torch::autograd::grad, backward()), and custom
// torch::autograd::Functions attach their own nodes to them. So:
//   - every wrapper mirrors its real tensor's autograd state (MirrorAutograd): a non-leaf gets the
//     real grad_fn as its gradient edge, a leaf that requires grad shares the real tensor's
//     gradient accumulator, so what C++ code reads is what eager would show and a backward pass
//     started from a wrapper runs on the real graph;
//   - a wrapper whose history differs from what was mirrored was given it by C++ autograd code
//     (a custom Function's forward returning it): its backward is the Function's own, which a
//     replay of the recorded inner ops would not run, so the trace is abandoned and the function
//     runs eagerly (reported);
//   - requires_grad_() on a wrapper (TensorBase::requires_grad_ is not an op) is seen as a leaf
//     whose own flag (AutogradMeta::requires_grad_, not requires_grad(), which also counts a
//     view's base) differs from its real tensor's, and replayed as the op aten::requires_grad_
//     (under InferenceMode for an inference tensor). The argument wrappers are compared before
//     every op and at the end, since views of an argument and the caller see its flag; other
//     wrappers when an op reads them or the function returns them;
//   - a wrapper is an inference tensor exactly when its real tensor is, and an op that returns
//     its input itself hands back the input's wrapper, so the checks autograd makes on them
//     (requires_grad_ on an inference tensor, in-place writes) are eager's;
//   - a backward pass inside the trace (a RecordFunction callback sees autograd's engine run a
//     node on this thread) is not captured: the trace is abandoned and the call re-runs eagerly,
//     or, when an argument or captured tensor was already written (a re-run would write it twice),
//     the engine's ops run untraced on real tensors and the function runs eagerly from then on.
struct AbortTrace : std::exception {
  const char* what() const noexcept override { return "warden: trace abandoned (the call re-runs eagerly)"; }
};

// The real tensor's grad_fn as Warden reads it: the node the tensor holds. grad_fn() itself would
// regenerate a view's history when its base was written in place since (raising for a view made
// under NoGradGuard or InferenceMode), a side effect eager has only where autograd or the user
// asks for it: the real ops of the trace do ask exactly where eager's would, and is_leaf() of the
// caller's tensors must not change because Warden looked.
NodePtr RealGradFn(const at::Tensor& real) {
  const torch::autograd::AutogradMeta* meta = torch::autograd::impl::get_autograd_meta(real);
  return meta != nullptr ? meta->grad_fn_ : nullptr;
}

// The flag requires_grad_() sets (requires_grad() also counts history and a view's base).
bool OwnRequiresGrad(const at::Tensor& t) {
  const torch::autograd::AutogradMeta* meta = torch::autograd::impl::get_autograd_meta(t);
  return meta != nullptr && meta->requires_grad_;
}

// Gives the wrapper `t` (over real tensor `w->real()`) its real tensor's autograd state.
void MirrorAutograd(TraceState& st, WrapperImpl* w, const at::Tensor& t) {
  const at::Tensor& real = w->real();
  if (!real.requires_grad()) return;
  const NodePtr fn = RealGradFn(real);
  if (fn != nullptr) {
    if (OwnRequiresGrad(t)) torch::autograd::impl::materialize_autograd_meta(t)->requires_grad_ = false;  // gained history
    torch::autograd::impl::set_gradient_edge(t, torch::autograd::Edge(fn, real.output_nr()));
    w->set_mirrored(fn.get());
    st.edge_values.emplace(std::make_pair(fn.get(), static_cast<uint32_t>(real.output_nr())), w->id());
    st.keep_alive.push_back(fn);
    return;
  }
  // A leaf: its own flag, written directly (the user's requires_grad_() calls on the wrapper are
  // what CheckAutograd compares with it).
  const bool flag = OwnRequiresGrad(real);
  torch::autograd::impl::materialize_autograd_meta(t)->requires_grad_ = flag;
  if (!flag) return;
  NodePtr acc = torch::autograd::impl::grad_accumulator(real);
  if (acc == nullptr) return;
  torch::autograd::impl::get_autograd_meta(t)->grad_accumulator_ = acc;
  st.edge_values.emplace(std::make_pair(acc.get(), 0u), w->id());
  st.keep_alive.push_back(std::move(acc));
}

std::string NodeName(const NodePtr& fn) {
  return fn != nullptr ? fn->name() : std::string("none");
}

// Abandons the trace (Note [Autograd inside the trace]): throws AbortTrace when the call can be
// re-run eagerly, else records why the function must run eagerly from now on and returns.
// `can_continue`: the trace may go on (untraced) when the call cannot be re-run; otherwise that
// case raises an error, since the call's result would be wrong.
void Abandon(TraceState& st, const std::string& why, bool can_continue) {
  if (st.untraceable.empty()) st.untraceable = why;
  if (!st.observable_write) {
    if (st.abort_reason.empty()) st.abort_reason = why;
    throw AbortTrace();
  }
  if (!can_continue) {
    throw Error(absl::StrCat("warden: the traced function ", why, ", after it had already written an argument or "
                             "captured tensor, so the call cannot be re-run eagerly; move the write after it or "
                             "call the function without warden"));
  }
}

void AbandonForGradAccess(const WrapperImpl& w, bool write) {
  TraceState* st = w.live_state();
  if (st == nullptr || st->syncing) return;
  if (!write && !w.real().grad().defined()) return;  // eager reads an undefined gradient too
  Abandon(*st,
          write ? "writes the .grad of a traced tensor (not an op: the cached graph could not repeat it)"
                : "reads the .grad of a traced tensor (not an op: the cached graph could not follow it)",
          /*can_continue=*/false);
}

// Checks one wrapper the function hands back to ATen (an op argument or a returned tensor) for
// autograd state that C++ code changed behind the tracer (Note [Autograd inside the trace]).
void CheckAutograd(TraceState& st, const at::Tensor& t) {
  WrapperImpl* w = AsWrapper(t);
  if (w == nullptr || w->live_state() != &st) return;
  const at::Tensor& real = w->real();
  if (!t.requires_grad() && !real.requires_grad()) return;
  const NodePtr& fn = t.grad_fn();
  if (fn != nullptr) {
    if (fn.get() != w->mirrored()) {
      Abandon(st,
              absl::StrCat("uses a C++ autograd node (", fn->name(),
                           ": a custom torch::autograd::Function) whose backward cannot be replayed from the "
                           "recorded ops"),
              /*can_continue=*/false);
      return;
    }
    if (RealGradFn(real).get() != fn.get()) MirrorAutograd(st, w, t);  // history rebased in place
    return;
  }
  if (RealGradFn(real) != nullptr) {  // the real tensor gained history after it was wrapped
    MirrorAutograd(st, w, t);
    return;
  }
  if (OwnRequiresGrad(t) == OwnRequiresGrad(real)) return;
  // requires_grad_() on a leaf: replay it as the op, so the cached graph does it too.
  st.syncing = true;
  struct Done {
    TraceState& st;
    ~Done() { st.syncing = false; }
  } done{st};
  // The flag of an inference tensor can only have been set inside InferenceMode, which may have
  // ended since: replay it there (the node records the mode, Note [Thread modes]).
  std::optional<c10::InferenceMode> inference;
  if (real.is_inference() && !c10::InferenceMode::is_enabled()) inference.emplace(true);
  const_cast<at::Tensor&>(t).__dispatch_requires_grad_(OwnRequiresGrad(t));
}

void CheckAutogradOfStack(TraceState& st, const torch::jit::Stack& stack, size_t num_args) {
  if (st.syncing) return;
  // The arguments first, whatever the op reads: requires_grad_() on an argument reaches the views
  // other arguments are of it (a view requires grad through its base), so it is replayed before
  // the next op, not when the argument is next used.
  for (const at::Tensor& t : st.arg_wrappers) CheckAutograd(st, t);
  for (size_t i = stack.size() - num_args; i < stack.size(); ++i) {
    const c10::IValue& iv = stack[i];
    if (iv.isTensor()) {
      CheckAutograd(st, iv.toTensor());
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorVector()) CheckAutograd(st, t);
    } else if (IsOptionalTensorList(iv)) {
      for (const c10::IValue& e : iv.toListRef()) {
        if (e.isTensor()) CheckAutograd(st, e.toTensor());
      }
    }
  }
}

// Runs an op untraced on real tensors (wrappers unwrapped, results left unwrapped): the ops of a
// backward pass that could not be abandoned (Note [Autograd inside the trace]).
void PassThrough(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t num_args = op.schema().arguments().size();
  for (size_t i = stack->size() - num_args; i < stack->size(); ++i) {
    c10::IValue& iv = (*stack)[i];
    if (iv.isTensor()) {
      if (WrapperImpl* w = AsWrapper(iv.toTensor())) iv = w->real();
    } else if (iv.isTensorList()) {
      c10::List<at::Tensor> reals;
      for (const at::Tensor& t : iv.toTensorVector()) {
        WrapperImpl* w = AsWrapper(t);
        reals.push_back(w != nullptr ? w->real() : t);
      }
      iv = reals;
    } else if (IsOptionalTensorList(iv)) {
      c10::List<c10::optional<at::Tensor>> reals;
      for (const c10::IValue& e : iv.toListRef()) {
        if (!e.isTensor()) {
          reals.push_back(c10::nullopt);
          continue;
        }
        WrapperImpl* w = AsWrapper(e.toTensor());
        reals.push_back(w != nullptr ? w->real() : e.toTensor());
      }
      iv = reals;
    } else {
      ConcretizeSymbolic(iv, nullptr);
    }
  }
  c10::impl::ExcludeDispatchKeyGuard exclude(kTraceKey);
  op.callBoxed(stack);
}

// RecordFunction callbacks on autograd's backward nodes, installed for the duration of a trace.
std::unique_ptr<at::ObserverContext> OnBackwardStart(const at::RecordFunction&) {
  if (current_state != nullptr) {
    ++current_state->backward_depth;
    current_state->backward_seen = true;
  }
  struct Context : at::ObserverContext {};
  return std::make_unique<Context>();
}
void OnBackwardEnd(const at::RecordFunction&, at::ObserverContext*) {
  if (current_state != nullptr && current_state->backward_depth > 0) --current_state->backward_depth;
}

// Ops whose result depends on a module's train()/eval() flag take it as one of these bool
// arguments; the trace sees only the bool (Note [Watched modules] in runtime/watch.cc).
bool IsModeArgument(const std::string& name) {
  return name == "train" || name == "training" || name == "use_input_stats";
}

void RecordModeDependent(TraceState& st, const c10::FunctionSchema& schema, const std::string& name,
                         const torch::jit::Stack& stack) {
  const size_t num_args = schema.arguments().size();
  for (size_t i = 0; i < num_args; ++i) {
    const c10::Argument& a = schema.arguments()[i];
    if (!IsModeArgument(a.name())) continue;
    const c10::IValue& v = stack[stack.size() - num_args + i];
    if (!v.isBool()) continue;
    std::string text = absl::StrCat(name, " at %", st.graph->nodes.size(), " (", a.name(), "=",
                                    v.toBool() ? "true" : "false", ")");
    if (!st.composite_stack.empty()) absl::StrAppend(&text, " inside ", st.composite_stack.front());
    st.graph->mode_dependent.push_back(std::move(text));
    return;
  }
}

// Dropout and friends draw only in training mode: with train=false they return the input (or a
// copy) and the node is deterministic (no random-op restrictions on later value guards). So do
// ops whose dropout probability is a constant 0 (multi-layer RNNs' `dropout`, attention's
// `dropout_p`).
bool DrawsNothing(const c10::FunctionSchema& schema, const Node& node) {
  for (size_t i = 0; i < node.args.size() && i < schema.arguments().size(); ++i) {
    const std::string& name = schema.arguments()[i].name();
    const NodeArg& a = node.args[i];
    if (a.kind != NodeArg::Kind::kConstant) continue;
    if (name == "train" && a.constant.isBool() && !a.constant.toBool()) return true;
    if ((name == "dropout" || name == "dropout_p") && a.constant.isDouble() && a.constant.toDouble() == 0.0) {
      return true;
    }
  }
  return false;
}

std::atomic<uint64_t> ops_seen{0};

void Fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  TraceState* st = current_state;
  ops_seen.fetch_add(1, std::memory_order_relaxed);
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  if (st == nullptr) {
    // A wrapper outside its trace: it escaped the traced function.
    throw Error(absl::StrCat("warden: ", OpName(schema),
                             " was called on a traced tensor after its trace ended; traced "
                             "tensors must not escape the traced function"));
  }
  if (!st->abort_reason.empty()) {
    // Abandoned, and the function caught AbortTrace. The call re-runs eagerly, so nothing more
    // may run (a write now would happen twice).
    throw AbortTrace();
  }
  if (st->backward_depth > 0) {  // Note [Autograd inside the trace]
    Abandon(*st,
            "computes gradients inside the function (torch::autograd::grad or backward()); the backward "
            "pass is not traced",
            /*can_continue=*/true);
    PassThrough(op, stack);
    return;
  }
  CheckAutogradOfStack(*st, *stack, num_args);
  const std::string name = OpName(schema);
  RecordModeDependent(*st, schema, name, *stack);
  const ThreadMode mode = ThreadMode::Current();  // Note [Thread modes]
  const ops::OpInfo* info = ops::Registry::Global().Find(name);

  if (info == nullptr && op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
    st->composite_stack.push_back(name);
    struct Pop {
      TraceState* st;
      ~Pop() { st->composite_stack.pop_back(); }
    } pop{st};
    // Note [Symbolic sizes]: a composite whose kernel takes IntArrayRef behind a SymInt[] schema
    // refuses symbolic arguments as it unpacks them, before it runs an op: retried with them
    // concretized (and remembered). A refusal after it recorded ops fails the whole attempt.
    bool symbolic = false;
    for (size_t i = stack->size() - num_args; i < stack->size(); ++i) symbolic |= HasSymbolic((*stack)[i]);
    if (symbolic && RefusesSymbolic(name)) {
      for (size_t i = stack->size() - num_args; i < stack->size(); ++i) ConcretizeSymbolic((*stack)[i], nullptr);
      symbolic = false;
    }
    if (!symbolic) {
      op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, *stack);
      return;
    }
    const std::vector<c10::IValue> saved(stack->end() - num_args, stack->end());
    const size_t base = stack->size() - num_args;
    const size_t nodes_before = st->graph->nodes.size();
    try {
      op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, *stack);
      return;
    } catch (const c10::Error& e) {
      if (!IsSymbolicRefusal(e)) throw;
      AddRefusing(name);
      if (st->graph->nodes.size() != nodes_before || stack->size() < base) throw;
    }
    stack->resize(base);
    for (c10::IValue v : saved) {
      ConcretizeSymbolic(v, nullptr);
      stack->push_back(std::move(v));
    }
    op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, *stack);
    return;
  }

  Graph& g = *st->graph;
  Node node;
  node.index = static_cast<int>(g.nodes.size());
  node.op = name;
  node.handle = op;
  node.kind = info != nullptr ? NodeKind::kRule : NodeKind::kOpaque;
  node.mutates = schema.is_mutable();
  bool has_generator = false;
  for (const auto& a : schema.arguments()) {
    if (a.type()->kind() == c10::TypeKind::OptionalType &&
        a.type()->containedType(0)->kind() == c10::TypeKind::GeneratorType) {
      has_generator = true;
    }
  }
  node.random = (info != nullptr && info->random) || has_generator;
  node.grad_of = st->grad_of;
  node.gradient_result = st->gradient_result;

  std::vector<ValueId> tensor_inputs;
  std::vector<at::Tensor> real_inputs;
  std::vector<WrapperImpl*> written_wrappers(num_args, nullptr);
  std::vector<WrapperImpl*> input_wrappers;  // of this trace, in argument order
  auto args = torch::jit::last(*stack, num_args);
  node.args.resize(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& iv = (*stack)[stack->size() - num_args + i];
    const auto* alias = schema.arguments()[i].alias_info();
    if (alias != nullptr && alias->isWrite() && iv.isTensor()) {
      written_wrappers[i] = AsWrapper(iv.toTensor());
    }
    if (iv.isTensor()) {
      WrapperImpl* w = AsWrapper(iv.toTensor());
      if (w != nullptr && w->live_state() == st) input_wrappers.push_back(w);
    }
    RecordArg(*st, iv, node.args[i], tensor_inputs, real_inputs);
  }
  (void)args;
  node.factory = (info != nullptr && info->factory) || tensor_inputs.empty();
  if (node.random && DrawsNothing(schema, node)) node.random = false;
  if (mode != st->entry_mode) node.mode = mode;

  if (st->verification && (node.random || (node.mutates && WritesArgumentOrConstant(g, node)))) {
    st->abort_reason = absl::StrCat("the verification trace reached ", name,
                                    node.random ? ", which draws random numbers" : ", which writes an argument or a captured tensor");
    throw AbortTrace();
  }
  {
    c10::impl::ExcludeDispatchKeyGuard exclude(kTraceKey);
    op.callBoxed(stack);
  }

  const size_t num_returns = schema.returns().size();
  const size_t first = stack->size() - num_returns;
  int output_index = 0;
  auto new_tensor_value = [&](const at::Tensor& real) {
    Value v;
    v.kind = ValueKind::kNode;
    v.meta = TensorMeta::Of(real);
    v.node = node.index;
    v.output_index = output_index++;
    v.alias_of = AliasedInput(real, tensor_inputs, real_inputs);
    const ValueId id = g.AddValue(std::move(v));
    if (c10::GradMode::is_enabled()) st->reals[id] = real;  // Note [Captured gradients]
    return id;
  };
  for (size_t j = 0; j < num_returns; ++j) {
    c10::IValue& iv = (*stack)[first + j];
    NodeReturn ret;
    if (iv.isTensor() && iv.toTensor().defined()) {
      const at::Tensor real = iv.toTensor();
      ret.kind = NodeReturn::Kind::kTensor;
      ValueId id = new_tensor_value(real);
      ret.values.push_back(id);
      // An in-place op returns its written argument: keep that wrapper (user code holds it) and
      // move it to the new version of the value.
      WrapperImpl* reuse = nullptr;
      const auto* alias = schema.returns()[j].alias_info();
      if (alias != nullptr && alias->isWrite()) {
        for (size_t i = 0; i < num_args; ++i) {
          const auto* a = schema.arguments()[i].alias_info();
          if (written_wrappers[i] != nullptr && a != nullptr &&
              a->beforeSets() == alias->beforeSets()) {
            reuse = written_wrappers[i];
          }
        }
      }
      // An op that hands back its input itself (`to` a dtype the tensor has, `contiguous` of a
      // contiguous one): eager returns the same object, so the user holds one tensor under two
      // names. Keep one wrapper too, moved to the result like an in-place op's (a second wrapper
      // would let requires_grad_() or InferenceMode on one name miss the other).
      for (size_t i = 0; reuse == nullptr && i < input_wrappers.size(); ++i) {
        if (input_wrappers[i]->real().unsafeGetTensorImpl() == real.unsafeGetTensorImpl()) reuse = input_wrappers[i];
      }
      if (reuse != nullptr) {
        reuse->set_id(id);
        iv = at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(reuse));
        MirrorAutograd(*st, reuse, iv.toTensor());  // an in-place op rebased its history
      } else {
        iv = Wrap(real, st, id);
        MirrorAutograd(*st, AsWrapper(iv.toTensor()), iv.toTensor());
      }
    } else if (iv.isTensor()) {
      ret.kind = NodeReturn::Kind::kTensor;  // undefined tensor result
      node.returns.push_back(ret);
      continue;
    } else if (iv.isTensorList()) {
      ret.kind = NodeReturn::Kind::kTensorList;
      c10::List<at::Tensor> wrapped;
      for (const at::Tensor& real : iv.toTensorVector()) {
        ValueId id = new_tensor_value(real);
        ret.values.push_back(id);
        at::Tensor w = Wrap(real, st, id);
        MirrorAutograd(*st, AsWrapper(w), w);
        wrapped.push_back(std::move(w));
      }
      iv = wrapped;
    } else if (iv.isNone()) {
      ret.kind = NodeReturn::Kind::kTensor;
    } else {
      // A non-tensor result computed from tensor data: the trace continues only under a value
      // guard on exactly this result (checked by the artifact on every run).
      ret.kind = NodeReturn::Kind::kScalar;
      node.kind = NodeKind::kDataDependent;
      if (st->scalar_overrides != nullptr) {
        auto it = st->scalar_overrides->find(node.index);
        if (it != st->scalar_overrides->end()) iv = it->second;  // what the function sees from here on
      }
      Value v;
      v.kind = ValueKind::kNode;
      v.is_tensor = false;
      v.node = node.index;
      v.output_index = output_index++;
      v.traced_scalar = iv;
      ret.values.push_back(g.AddValue(std::move(v)));
    }
    node.returns.push_back(std::move(ret));
  }
  if (info != nullptr && info->data_dependent_shape) node.kind = NodeKind::kDataDependent;
  if (node.kind == NodeKind::kDataDependent && st->side_effect_seen && st->untraceable.empty()) {
    // The artifact checks this node's result on every run and gives up when it differs; that is
    // only sound while nothing observable has happened yet.
    st->untraceable = absl::StrCat(
        "data-dependent ", name, " at %", node.index,
        " follows a mutation or random op, so a value-guard failure could not be undone");
  }
  if (info != nullptr && node.kind == NodeKind::kRule) CheckRule(*st, *info, node);
  if (node.mutates) ReadStridesBehindWrite(*st, node);  // Note [View or copy]
  if (node.mutates && WritesArgumentOrConstant(g, node)) {
    st->side_effect_seen = true;
    st->observable_write = true;
  }
  if (node.random) st->side_effect_seen = true;
  g.nodes.push_back(std::move(node));
}

TORCH_LIBRARY_IMPL(_, DeferredInit, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&Fallback>());
}

// Note [Outside history]
// A gradient taken inside the function follows the traced ops back to the values it is taken
// with respect to. An argument or captured tensor that arrives with autograd history (a view of
// another argument, the output of an earlier computation) carries edges the trace never sees: in
// eager, d/dx also runs through y = x.view(...) passed as a second argument. So a gradient is
// captured only when every argument and captured tensor that requires grad is a leaf (the usual
// cases: parameters, inputs made with requires_grad_()); otherwise the call runs eagerly, with the
// reason. Precisely, every one of them that the differentiated outputs depend on. The hit path
// keeps the promise through the requires_grad guard, which tells a leaf from a tensor with
// history (Note [Leaf guard] in guards/builder.cc): such a call misses, and its trace runs
// eagerly. (Captured tensors are held by the graph: their history cannot change.)
//
// Note [Captured gradients]
// A gradient taken inside a traced function (torch::autograd::grad, with or without create_graph)
// becomes ordinary graph nodes: Warden's engine (installed as autograd's default engine; outside a
// trace it hands every call to LibTorch's own) receives the call's roots, grad_outputs and
// inputs as autograd edges. Every traced tensor mirrors its real tensor's edge (Note [Autograd
// inside the trace]), so each edge maps back to the value that carries it: the traced ops from
// the inputs to the roots are walked in reverse, and each one's derivative rule (ops/
// derivatives.h) runs on traced tensors, so the backward ops are recorded like the forward's and
// the backends compile both into one artifact (the cpp backend fuses the backward's pointwise
// work). Without create_graph the gradients are detached, as eager's have no history.
// The derivative rules replace autograd's formulas rather than tracing them: autograd's backward
// nodes run on the real tensors, beneath the trace key, where they cannot be recorded without a
// second capture layer below Autograd. Rules give control (the backward is fusible ATen ops, and
// the gradient of a gradient is captured the same way) at the price of coverage: an op on the path
// without a rule, a custom autograd::Function, a write in place to something the backward reads,
// backward() (it accumulates into .grad, which is not an op), grad_outputs of another shape or
// dtype than their output, or a second pass through a graph released by the first all fall back
// to the previous behaviour: the trace is abandoned and the call runs eagerly, with the reason.

using torch::autograd::edge_list;
using torch::autograd::variable_list;

std::vector<ValueId> TensorOutputs(const Node& n) {
  std::vector<ValueId> ids;
  for (const NodeReturn& r : n.returns) {
    if (r.kind == NodeReturn::Kind::kScalar) continue;
    for (ValueId v : r.values) ids.push_back(v);
  }
  return ids;
}

// The tensor inputs of a node as derivative rules number them: one slot per Tensor or Tensor?
// parameter of the schema (kNoValue where it is None), one per element of a Tensor[].
std::vector<ValueId> TensorSlots(const Node& n) {
  if (!n.handle) return InputValues(n);
  const auto& params = n.handle->schema().arguments();
  std::vector<ValueId> ids;
  for (size_t i = 0; i < n.args.size() && i < params.size(); ++i) {
    const NodeArg& a = n.args[i];
    if (a.kind == NodeArg::Kind::kValue) {
      ids.push_back(a.value);
    } else if (a.kind == NodeArg::Kind::kValueList || a.kind == NodeArg::Kind::kOptValueList) {
      for (ValueId v : a.values) ids.push_back(v);
    } else {
      c10::TypePtr t = params[i].type();
      if (t->kind() == c10::TypeKind::OptionalType) t = t->containedType(0);
      if (t->kind() == c10::TypeKind::TensorType) ids.push_back(kNoValue);  // None
    }
  }
  return ids;
}

struct CaptureFailed {
  std::string why;
};

class GradientCapture {
 public:
  explicit GradientCapture(TraceState& st) : st_(st), g_(*st.graph) {}

  variable_list Run(const edge_list& roots, const variable_list& grad_outputs, bool keep_graph, bool create_graph,
                    const edge_list& inputs) {
    const int first_node = static_cast<int>(g_.nodes.size());
    std::vector<ValueId> wanted;
    for (const torch::autograd::Edge& e : inputs) wanted.push_back(ValueOf(e, "an input to differentiate"));
    std::vector<ValueId> root_values;
    for (size_t i = 0; i < roots.size(); ++i) root_values.push_back(ValueOf(roots[i], "a differentiated output"));
    CheckWrites();
    CheckOutsideHistory(root_values);
    // Values that depend on a wanted input.
    std::vector<char> dep(g_.values.size(), 0);
    for (ValueId v : wanted) dep[v] = 1;
    for (const Node& n : g_.nodes) {
      bool any = false;
      for (ValueId v : InputValues(n)) any |= v != kNoValue && dep[v];
      if (!any) continue;
      for (ValueId v : TensorOutputs(n)) dep[v] = 1;
    }
    for (size_t i = 0; i < roots.size(); ++i) {
      const at::Tensor& go = grad_outputs.at(i);
      if (!go.defined()) throw CaptureFailed{"a grad_output is undefined"};
      const at::Tensor root_real = Real(root_values[i]);
      const at::Tensor go_real = RealOf(go);
      if (!go_real.sizes().equals(root_real.sizes()) || go_real.scalar_type() != root_real.scalar_type()) {
        throw CaptureFailed{"a grad_output's shape or dtype differs from its output's"};
      }
      Accumulate(root_values[i], go);
    }
    std::vector<int> path;
    for (int k = first_node - 1; k >= 0; --k) {
      const Node n = g_.nodes[k];  // a copy: the rules below append to g_.nodes
      const std::vector<ValueId> outs = TensorOutputs(n);
      std::vector<at::Tensor> out_grads;
      bool any_grad = false;
      for (ValueId v : outs) {
        auto it = grads_.find(v);
        out_grads.push_back(it != grads_.end() ? it->second : at::Tensor());
        any_grad |= it != grads_.end();
      }
      if (!any_grad) continue;
      const std::vector<ValueId> ins = TensorSlots(n);
      std::vector<bool> needs;
      bool any_need = false;
      for (ValueId v : ins) {
        const bool need = v != kNoValue && dep[v] && g_.value(v).meta.requires_grad;
        needs.push_back(need);
        any_need |= need;
      }
      if (!any_need) continue;
      Differentiate(n, ins, outs, out_grads, needs);
      path.push_back(n.index);
    }
    variable_list result;
    for (ValueId v : wanted) {
      auto it = grads_.find(v);
      at::Tensor r = it != grads_.end() ? it->second : at::Tensor();
      if (r.defined() && !create_graph) {
        st_.gradient_result = true;
        struct ResetGradientResult {
          TraceState& st;
          ~ResetGradientResult() { st.gradient_result = false; }
        } reset{st_};
        r = r.detach();
      }
      result.push_back(r);
    }
    if (!keep_graph) st_.released.insert(path.begin(), path.end());
    // What the backward reads of the forward: the values a replay keeps alive for it.
    std::set<ValueId> saved;
    for (size_t k = first_node; k < g_.nodes.size(); ++k) {
      for (ValueId v : InputValues(g_.nodes[k])) {
        if (v == kNoValue) continue;
        const Value& val = g_.value(v);
        if (val.kind != ValueKind::kNode || val.node < first_node) saved.insert(v);
      }
    }
    std::string saved_names;
    for (ValueId v : saved) absl::StrAppend(&saved_names, saved_names.empty() ? "" : ", ", g_.ValueName(v));
    std::string names;
    for (ValueId v : wanted) absl::StrAppend(&names, names.empty() ? "" : ", ", g_.ValueName(v));
    std::string outs;
    for (ValueId v : root_values) absl::StrAppend(&outs, outs.empty() ? "" : ", ", g_.ValueName(v));
    g_.gradients.push_back(absl::StrCat("d(", outs, ") / d(", names, "): ", path.size(), " forward ops, backward at %",
                                        first_node, "..%", static_cast<int>(g_.nodes.size()) - 1,
                                        "; reads ", saved_names.empty() ? "nothing" : saved_names, " of the forward",
                                        create_graph ? "; create_graph" : ""));
    return result;
  }

 private:
  // Note [Outside history]: no argument or captured tensor the roots depend on may carry history
  // from outside.
  void CheckOutsideHistory(const std::vector<ValueId>& root_values) {
    std::vector<char> feeds(g_.values.size(), 0);
    for (ValueId v : root_values) feeds[v] = 1;
    for (int k = static_cast<int>(g_.nodes.size()) - 1; k >= 0; --k) {
      bool any = false;
      for (ValueId v : TensorOutputs(g_.nodes[k])) any |= v != kNoValue && feeds[v];
      if (!any) continue;
      for (ValueId v : InputValues(g_.nodes[k])) {
        if (v != kNoValue) feeds[v] = 1;
      }
    }
    for (ValueId v = 0; v < static_cast<ValueId>(feeds.size()); ++v) {
      if (!feeds[v]) continue;
      auto it = st_.outside_history.find(v);
      if (it != st_.outside_history.end()) {
        throw CaptureFailed{absl::StrCat(it->second, " has autograd history from outside the function (not a leaf), ",
                                         "which the gradient may run through into another of its inputs; the graph ",
                                         "does not see it (Note [Outside history])")};
      }
    }
  }

  ValueId ValueOf(const torch::autograd::Edge& e, const char* what) {
    auto it = st_.edge_values.find({e.function.get(), e.input_nr});
    if (e.function == nullptr || it == st_.edge_values.end()) {
      throw CaptureFailed{absl::StrCat(what, " was not computed by the traced ops (its autograd node is ",
                                       NodeName(e.function), ")")};
    }
    return it->second;
  }

  // By value: the rules append to g_.values, which may move the constant.
  at::Tensor Real(ValueId v) {
    const Value& val = g_.value(v);
    if (val.kind == ValueKind::kConstant) return val.constant;
    auto it = st_.reals.find(v);
    if (it == st_.reals.end()) throw CaptureFailed{absl::StrCat(g_.ValueName(v), " was made with grad mode off")};
    return it->second;
  }

  static at::Tensor RealOf(const at::Tensor& t) {
    WrapperImpl* w = AsWrapper(t);
    return w != nullptr ? w->real() : t;
  }

  at::Tensor Traced(ValueId v) {
    auto it = traced_.find(v);
    if (it != traced_.end()) return it->second;
    at::Tensor t = Wrap(Real(v), &st_, v);
    MirrorAutograd(st_, AsWrapper(t), t);
    traced_.emplace(v, t);
    return t;
  }

  void Accumulate(ValueId v, const at::Tensor& grad) {
    auto it = grads_.find(v);
    if (it == grads_.end()) {
      grads_.emplace(v, grad);
    } else {
      it->second = at::add(it->second, grad);
    }
  }

  // A write in place after a node the backward reads would make the replay read the new data
  // where eager's autograd raises; the last write per storage (requires_grad_ changes no data).
  void CheckWrites() {
    for (const Node& n : g_.nodes) {
      if (!n.mutates || n.op == "aten::requires_grad_") continue;
      for (ValueId v : WrittenValues(n)) {
        int& last = last_write_[g_.RootOf(v)];
        last = std::max(last, n.index);
      }
    }
  }

  void Differentiate(const Node& n, const std::vector<ValueId>& ins, const std::vector<ValueId>& outs,
                     const std::vector<at::Tensor>& out_grads, const std::vector<bool>& needs) {
    const std::string at = absl::StrCat(n.op, " at %", n.index);
    if (st_.released.count(n.index)) {
      // Eager's autograd freed what this pass needs; its error, not a result.
      TORCH_CHECK(false, "Trying to backward through the graph a second time (or directly access saved tensors after "
                         "they have already been freed). Specify retain_graph=true if you need to backward through "
                         "the graph a second time (Warden: ", at, " was differentiated by a pass without retain_graph)");
    }
    const ops::DerivativeRule rule = ops::FindDerivative(n.op);
    if (rule == nullptr) throw CaptureFailed{absl::StrCat(at, " has no derivative rule in ops/derivatives.cc")};
    if (n.mode) throw CaptureFailed{absl::StrCat(at, " ran under a thread-local mode the function set")};
    for (ValueId v : ins) {
      if (v == kNoValue) continue;
      auto it = last_write_.find(g_.RootOf(v));
      if (it != last_write_.end() && it->second > n.index) {
        throw CaptureFailed{absl::StrCat(at, " reads a tensor that %", it->second, " later writes in place")};
      }
      if (c10::isComplexType(g_.value(v).meta.dtype)) throw CaptureFailed{absl::StrCat(at, " has a complex input")};
    }
    for (ValueId v : outs) {
      auto it = last_write_.find(g_.RootOf(v));
      if (it != last_write_.end() && it->second > n.index) {
        throw CaptureFailed{absl::StrCat(at, "'s result is later written in place")};
      }
    }
    std::vector<c10::IValue> args;
    for (const NodeArg& a : n.args) {
      switch (a.kind) {
        case NodeArg::Kind::kConstant:
          // An int C++ computed from symbolic sizes: the rule's copy of it is a literal, so the
          // sizes it came from are specialized (Note [Symbolic sizes]).
          for (const SymElem& e : a.sym_elems) {
            for (int leaf : e.expr.symbols()) {
              const SymLeaf& l = g_.sym_leaves.at(leaf);
              st_.OnRead(l.value, MetadataRead::What::kSizes, l.dim);
            }
          }
          args.push_back(a.constant);
          break;
        case NodeArg::Kind::kValue:
          if (!g_.value(a.value).is_tensor) throw CaptureFailed{absl::StrCat(at, " takes a captured scalar")};
          args.emplace_back(Traced(a.value));
          break;
        case NodeArg::Kind::kValueList: {
          c10::List<at::Tensor> list;
          for (ValueId v : a.values) list.push_back(Traced(v));
          args.emplace_back(list);
          break;
        }
        case NodeArg::Kind::kOptValueList: {
          c10::List<c10::optional<at::Tensor>> list;
          for (ValueId v : a.values) {
            list.push_back(v == kNoValue ? c10::optional<at::Tensor>() : c10::optional<at::Tensor>(Traced(v)));
          }
          args.emplace_back(list);
          break;
        }
      }
    }
    std::vector<at::Tensor> outputs;
    for (ValueId v : outs) outputs.push_back(Traced(v));
    ops::GradContext c{args, outputs, out_grads, needs,
                       [](const at::Tensor& t) { return RealOf(t).sizes().vec(); },
                       [](const at::Tensor& t) { return RealOf(t).strides().vec(); }};
    std::vector<at::Tensor> in_grads;
    // The ops recorded from here on (the rule's, the casts, the accumulation) are node n's backward.
    st_.grad_of = n.index;
    struct ResetGradOf {
      TraceState& st;
      ~ResetGradOf() { st.grad_of = -1; }
    } reset{st_};
    try {
      in_grads = rule(c);
    } catch (const AbortTrace&) {
      throw;
    } catch (const std::exception& e) {
      throw CaptureFailed{absl::StrCat("the derivative rule of ", at, " failed: ", e.what())};
    }
    if (in_grads.size() > ins.size()) {
      throw CaptureFailed{absl::StrCat("the derivative rule of ", at, " returned ", in_grads.size(), " gradients for ",
                                       ins.size(), " inputs")};
    }
    in_grads.resize(ins.size());
    for (size_t i = 0; i < ins.size(); ++i) {
      if (!needs[i]) continue;
      if (!in_grads[i].defined()) {
        // A rule leaves out only what it cannot differentiate (masked_fill's value tensor).
        throw CaptureFailed{absl::StrCat("the derivative rule of ", at, " does not differentiate its input ", i)};
      }
      at::Tensor gi = in_grads[i];
      const at::ScalarType dtype = g_.value(ins[i]).meta.dtype;
      if (RealOf(gi).scalar_type() != dtype) gi = gi.to(dtype);
      if (!RealOf(gi).sizes().equals(Real(ins[i]).sizes())) {
        throw CaptureFailed{absl::StrCat("the derivative rule of ", at, " gave input ", i, " a gradient of shape ",
                                         ShapeString(RealOf(gi).sizes().vec()), " for ",
                                         ShapeString(Real(ins[i]).sizes().vec()))};
      }
      Accumulate(ins[i], gi);
    }
  }

  TraceState& st_;
  Graph& g_;
  std::map<ValueId, at::Tensor> grads_;
  std::map<ValueId, at::Tensor> traced_;
  std::map<ValueId, int> last_write_;
};

// Autograd's default engine while Warden is loaded: a call from inside a trace is captured
// (Note [Captured gradients]), every other call goes to LibTorch's engine unchanged.
class CapturingEngine final : public torch::autograd::Engine {
 public:
  variable_list execute(const edge_list& roots, const variable_list& inputs, bool keep_graph, bool create_graph,
                        bool accumulate_grad, const edge_list& outputs) override {
    TraceState* st = current_state;
    if (st != nullptr && !st->finished && st->backward_depth == 0 && st->abort_reason.empty() &&
        st->untraceable.empty()) {
      std::string why;
      if (accumulate_grad || outputs.empty()) {
        why = "backward() accumulates into .grad, which is not an op (torch::autograd::grad is captured)";
      } else {
        try {
          GradientCapture capture(*st);
          return capture.Run(roots, inputs, keep_graph, create_graph, outputs);
        } catch (const CaptureFailed& f) {
          why = f.why;
        }
      }
      Abandon(*st,
              absl::StrCat("computes gradients inside the function (torch::autograd::grad or backward()) that "
                           "Warden cannot capture: ",
                           why),
              /*can_continue=*/true);
    }
    return torch::autograd::Engine::get_base_engine().execute(roots, inputs, keep_graph, create_graph, accumulate_grad,
                                                               outputs);
  }
};

torch::autograd::Engine& CapturingEngineInstance() {
  static auto* engine = new CapturingEngine();
  return *engine;
}

// Installed once, at load time, unless another engine (Python's) already replaced the default.
const bool capturing_engine_installed = [] {
  if (&torch::autograd::Engine::get_default_engine() != &torch::autograd::Engine::get_base_engine()) return false;
  torch::autograd::set_default_engine_stub(&CapturingEngineInstance);
  return true;
}();

// Observes autograd's backward nodes on this thread while it lives (Note [Autograd inside the
// trace]).
class BackwardObserver {
 public:
  BackwardObserver()
      : handle_(at::addThreadLocalCallback(at::RecordFunctionCallback(&OnBackwardStart, &OnBackwardEnd)
                                               .scopes({at::RecordScope::BACKWARD_FUNCTION}))) {}
  ~BackwardObserver() { at::removeCallback(handle_); }
  BackwardObserver(const BackwardObserver&) = delete;
  BackwardObserver& operator=(const BackwardObserver&) = delete;

 private:
  at::CallbackHandle handle_;
};

// Makes `state` current for this thread and ends the trace on scope exit (also on exceptions).
class ScopedTrace {
 public:
  explicit ScopedTrace(TraceState* state) : state_(state), previous_(current_state) {
    current_state = state;
  }
  ~ScopedTrace() {
    state_->finished = true;
    current_state = previous_;
  }

 private:
  TraceState* state_;
  TraceState* previous_;
};

}  // namespace

bool IsTracing() { return current_state != nullptr; }

uint64_t OpsSeen() { return ops_seen.load(std::memory_order_relaxed); }

// Thrown out of an attempt whose function raised while symbolic sizes were out (Note [Symbolic
// sizes]): Trace takes it again with plain sizes.
struct RetakeWithPlainSizes {};

TraceResult TraceAttempt(const TracedFn& fn, const std::vector<c10::IValue>& args,
                         const std::vector<std::string>& arg_names, bool verification,
                         const std::map<int, c10::IValue>* scalar_overrides, bool symbolic_sizes) {
  auto state = std::make_unique<TraceState>();
  state->verification = verification;
  state->symbolic_sizes = symbolic_sizes;
  if (verification) state->scalar_overrides = scalar_overrides;
  Graph& g = *state->graph;
  g.arg_names = arg_names;
  for (size_t i = g.arg_names.size(); i < args.size(); ++i) g.arg_names.push_back(absl::StrCat("arg", i));
  std::vector<c10::IValue> traced_args;
  traced_args.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& a = args[i];
    ValueId vid = kNoValue;
    if (a.isTensor() && a.toTensor().defined()) {
      if (AsWrapper(a.toTensor()) != nullptr) {
        // A wrapper that escaped an earlier trace has no storage: wrapping it again would make
        // every op look like raw data access (and the function eager for good).
        throw Error(absl::StrCat("warden: argument '", g.arg_names[i],
                                 "' is a traced tensor of another trace; traced tensors must not "
                                 "escape the traced function"));
      }
      g.arg_kinds.push_back(ArgKind::kTensor);
      // The same tensor passed again: the same traced tensor, so identity inside the trace is what
      // eager sees; the graph reads the first occurrence (Note [Argument identity] in guards/).
      size_t first = 0;
      while (first < i && !(args[first].isTensor() && args[first].toTensor().is_same(a.toTensor()))) ++first;
      if (first < i) {
        traced_args.push_back(traced_args[first]);
        g.arg_values.push_back(kNoValue);
        continue;
      }
      Value v;
      v.kind = ValueKind::kInput;
      v.arg_index = static_cast<int>(i);
      v.meta = TensorMeta::Of(a.toTensor());
      vid = g.AddValue(std::move(v));
      state->reals[vid] = a.toTensor();
      traced_args.push_back(Wrap(a.toTensor(), state.get(), vid));
      state->arg_wrappers.push_back(traced_args.back().toTensor());
      if (a.toTensor().requires_grad() && RealGradFn(a.toTensor()) != nullptr) {
        state->outside_history[vid] = absl::StrCat("argument ", i);
      }
      MirrorAutograd(*state, AsWrapper(traced_args.back().toTensor()), traced_args.back().toTensor());
    } else {
      if (a.isTensor()) {
        g.arg_kinds.push_back(ArgKind::kUndefinedTensor);
      } else if (a.isInt()) {
        g.arg_kinds.push_back(ArgKind::kInt);
      } else if (a.isDouble()) {
        g.arg_kinds.push_back(ArgKind::kDouble);
      } else if (a.isBool()) {
        g.arg_kinds.push_back(ArgKind::kBool);
      } else {
        throw Error(absl::StrCat("warden: argument '", g.arg_names[i], "' has unsupported type ",
                                 a.tagKind(), "; expected Tensor, int, double or bool"));
      }
      traced_args.push_back(a);
    }
    g.arg_values.push_back(vid);
  }

  TraceResult result;
  result.graph = state->graph;
  g.entry_mode = ThreadMode::Current();
  state->entry_mode = g.entry_mode;
  // An abandoned trace (Note [Autograd inside the trace]): the caller re-runs the call eagerly.
  auto abandoned = [&] {
    result.untraceable = state->untraceable.empty() ? state->abort_reason : state->untraceable;
    result.rerun_eagerly = true;
    result.outputs.clear();
    return result;
  };
  {
    ScopedTrace scope(state.get());
    std::vector<at::Tensor> outs;
    try {
      BackwardObserver observer;
      c10::impl::IncludeDispatchKeyGuard include(kTraceKey);
      outs = fn(traced_args);
    } catch (const AbortTrace&) {
      return abandoned();
    } catch (const c10::Error& e) {
      if (!state->abort_reason.empty()) return abandoned();
      // Sizes are handed out symbolically only until the first observable write, so the function
      // can run again from the start with plain sizes.
      // Any error, not only a refusal: kernels may misread a symbolic size in ways that do not
      // say so (at::TensorGeometry of a wrapper); an error eager raises too is raised again.
      if (state->symbolic_handed_out && !state->observable_write) throw RetakeWithPlainSizes();
      if (!IsRawDataAccess(e)) throw;
      const std::string what =
          "reads raw data of a traced tensor (data_ptr(), accessor(), printing); only item() and "
          "ATen ops are traceable";
      if (state->observable_write) {
        throw Error(absl::StrCat("warden: the function ", what,
                                 ", after it had already written an argument or captured tensor, "
                                 "so it cannot be re-run eagerly; move the raw access before the "
                                 "in-place op or call the function without warden"));
      }
      result.untraceable = what;
      result.rerun_eagerly = true;
      return result;
    } catch (...) {
      if (!state->abort_reason.empty()) return abandoned();  // AbortTrace, converted on its way out
      throw;
    }
    if (!state->abort_reason.empty()) return abandoned();  // the function caught AbortTrace
    try {
      for (const at::Tensor& t : outs) {
        if (t.defined()) CheckAutograd(*state, t);
      }
      // The arguments outlive the call: a requires_grad_() on one that nothing read afterwards
      // must be replayed too.
      for (const at::Tensor& t : state->arg_wrappers) CheckAutograd(*state, t);
    } catch (const AbortTrace&) {
      return abandoned();
    }
    for (const at::Tensor& t : outs) {
      if (!t.defined()) {
        g.outputs.push_back(kNoValue);
        result.outputs.push_back(t);
        continue;
      }
      at::Tensor real;
      g.outputs.push_back(TensorValue(*state, t, &real));
      result.outputs.push_back(real);
    }
  }
  for (auto& [key, read] : state->reads) result.reads.push_back(read);
  result.untraceable = state->untraceable;
  result.rule_mismatches = state->rule_mismatches;
  result.graph = state->graph;
  return result;
}

TraceResult Trace(const TracedFn& fn, const std::vector<c10::IValue>& args,
                  const std::vector<std::string>& arg_names, bool verification,
                  const std::map<int, c10::IValue>* scalar_overrides) {
  // WARDEN_SYMBOLIC_SIZES=0 hands out plain sizes (to measure what symbolic ones save).
  static const bool symbolic = [] {
    const char* v = std::getenv("WARDEN_SYMBOLIC_SIZES");
    return v == nullptr || std::string(v) != "0";
  }();
  if (!symbolic) return TraceAttempt(fn, args, arg_names, verification, scalar_overrides, false);
  try {
    return TraceAttempt(fn, args, arg_names, verification, scalar_overrides, /*symbolic_sizes=*/true);
  } catch (const RetakeWithPlainSizes&) {
    // Again with plain sizes (every size it reads then is an ordinary read); an error the
    // function raises with those too reaches the caller.
    return TraceAttempt(fn, args, arg_names, verification, scalar_overrides, /*symbolic_sizes=*/false);
  }
}

}  // namespace warden::tracer
