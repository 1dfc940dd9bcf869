// Note [Which guards]
// - Always: global state the replay depends on (grad mode and inference mode change what ATen
//   returns; the thread's dispatch-key words carry autocast and below-autograd guards, and
//   autocast's dtype is guarded while it is on: Note [Thread modes]), the argument count, each argument's type, and for tensors dtype, device, layout and
//   requires_grad. dtype has to be guarded even for unused tensors because user code can branch
//   on it without the tracer seeing the read (TensorImpl::dtype() is not virtual).
// - Rank and sizes: only for tensors the graph uses (an input of some node, an output) or whose
//   sizes were read by user code or a composite kernel. An argument the graph never reads gets no
//   shape guard and never recompiles on a new shape.
// - Strides: only where strides were read (is_contiguous(), strides(), ...). The replay backend
//   calls the same ATen ops, which handle any layout exactly as eager does, so nothing else in the
//   artifact depends on strides. A read on an intermediate value guards the strides of every used
//   argument, because layout propagates through ops in ways the graph does not track. An entry
//   that verifies argument strides per value instead (Note [Verified size reads]) gets none.
// - Scalars: type and value (NaN equals NaN; -0.0 differs from 0.0): C++ code turns them into op
//   arguments invisibly, so the graph is valid for exactly the traced value.
// - Aliasing: when the graph writes an argument (or a view of one), which other arguments share
//   its storage changes the results, so storage sharing is guarded pairwise against the written
//   arguments.
// - Dispatch keys: every tensor argument's key set, compared before anything reads its sizes
//   (Note [Dispatch keys]).
// - Identity: with two or more tensor arguments, which of them are the same tensor object
//   (Note [Argument identity]).
// - Captured tensors: the metadata of every tensor the graph captured (Note [Captured tensors]).
// - Default dtype: when a factory op or a floating-point scalar argument could have used it, or an
//   op made a floating result from integer or bool operands (int / int, exp of an int tensor).
//
// Note [Dispatch keys]
// dtype, device and layout do not say what kind of tensor an argument is: a ZeroTensor (no data),
// a negative or conjugate view, a functionalization wrapper, a nested tensor all have a dense CPU
// float's. Their dispatch key sets differ, and the replay's ops or a fused kernel would treat them
// as what was traced (a null data pointer, a sign lost). So the key set of every tensor argument
// is guarded, exactly (raw bits: inference tensors, which lack the autograd keys, get entries of
// their own). It is checked before any size is read (the kind table's order, and first in the
// hit path's record), because a nested tensor's sizes() throws and the hit path must not.
// The signature hash (guards/signature.cc) reads no sizes of a nested tensor either.
//
// Note [Leaf guard]
// C++ code can also read an argument's autograd state without an op: `x.is_leaf()`, `x.grad_fn()`
// (a training loop's "if (!x.is_leaf()) x.retain_grad()", a helper that detaches only what has
// history). requires_grad alone does not say it: a tensor made by requires_grad_() and one computed
// from it both require grad. So the requires_grad guard holds three states (GradState in
// guards/guard.h): false, true and a leaf, true with history; a call that changes the state misses.
// (Gradients taken inside also need it: Note [Outside history] in tracer/tracer.cc.)
//
// Note [Argument identity]
// C++ code can see whether two arguments are the same tensor (`a.is_same(b)`, `&a == &b` on the
// TensorImpl, a map keyed by it) and the tracer cannot see it look: TensorImpl identity is a
// pointer compare, not a dispatched op. So the trace makes identity real and the guard keeps it:
// Trace() gives a tensor passed twice one wrapper (so `is_same` inside the trace answers as eager
// does, and the graph reads the first occurrence), and a kArgIdentity guard records, for every
// tensor argument, the first argument that is the same object. A call with another identity
// pattern, in either direction (distinct -> same or same -> distinct), misses and re-traces. The
// guard is added whenever there are two tensor arguments, whether or not the graph writes one:
// the function's C++ branches are invisible. Storage sharing without identity (a view of another
// argument) is a different question: reading it (is_alias_of) is raw storage access that makes the
// function run eagerly, and the graph's own writes are covered by the kAliasing guards above.
// Cost (guards/evaluator.cc): up to 8 tensor arguments, n^2/2 pointer compares without a branch
// per pair (inside the hit path's record loop when the trace saw them all distinct); more, one
// probe each into a hash table on the stack. ~2 ns at 4 arguments, ~3 ns per argument beyond 8.
//
// Note [Captured tensors]
// A tensor the function captured (a module's parameter, a C++ variable) enters the graph as a
// constant the first time an op reads it, and the graph holds it by reference, so its values are
// read afresh on every call, as eager reads them. Its metadata is another matter: C++ code reads
// `w.size(0)` without the tracer seeing it (the tensor is not a wrapper), and someone can change
// it in place between calls (`resize_`, `set_`, `set_data` as Module::to does, `requires_grad_`).
// Each captured tensor therefore gets a kCapturedTensor guard: its dispatch keys, dtype, device
// and requires_grad, and for a plain strided TensorImpl its sizes, strides and storage offset, as
// the trace first saw them. The check reads the held TensorImpl directly (no argument involved),
// a few loads and two memcmps per captured tensor. What stays invisible: a captured tensor no op
// reads (its metadata can only reach the graph through C++, which Warden cannot see; pass it as
// an argument), and rebinding a C++ variable to another tensor (the graph keeps the old one).
// A tensor over memory it does not own (torch::from_blob without a deleter) is never captured:
// the memory may be refilled or freed after the call, so the tracer makes the function run
// eagerly (BorrowsMemory in tracer/tracer.cc); with a deleter the caller vouches for its lifetime.
#include "guards/builder.h"

#include <algorithm>
#include <optional>
#include <set>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include "absl/strings/str_cat.h"

namespace warden::guards {
namespace {

using tracer::Graph;
using tracer::NodeArg;
using tracer::ValueId;

// First node that uses each argument, for provenance ("used by aten::add.Tensor at %0").
std::vector<std::string> FirstUse(const Graph& g) {
  std::vector<std::string> use(g.arg_kinds.size());
  auto mark = [&](ValueId id, const std::string& by) {
    if (id == tracer::kNoValue) return;
    const int arg = g.BaseArg(id);
    if (arg >= 0 && use[arg].empty()) use[arg] = by;
  };
  for (const tracer::Node& n : g.nodes) {
    const std::string by = absl::StrCat("used by ", n.op, " at %", n.index);
    for (const NodeArg& a : n.args) {
      if (a.kind == NodeArg::Kind::kValue) mark(a.value, by);
      for (ValueId id : a.values) mark(id, by);
    }
  }
  for (ValueId id : g.outputs) mark(id, "returned as an output");
  // C++ computed op arguments or comparisons from its symbolic sizes (Note [Symbolic sizes]).
  for (const tracer::SymLeaf& l : g.sym_leaves) mark(l.value, "its sizes were taken symbolically by C++");
  return use;
}

// True when an op's result is floating-point although none of its tensor operands is: ATen took
// the result dtype from the default dtype (true division or exp of an integer tensor, mean of a
// bool mask, ...).
bool PromotesToDefaultDtype(const Graph& g, const tracer::Node& n) {
  bool floating_result = false;
  for (const tracer::NodeReturn& r : n.returns) {
    for (ValueId id : r.values) {
      const tracer::Value& v = g.value(id);
      if (v.is_tensor && at::isFloatingType(v.meta.dtype)) floating_result = true;
    }
  }
  if (!floating_result) return false;
  for (const NodeArg& a : n.args) {
    std::vector<ValueId> ids = a.kind == NodeArg::Kind::kValue ? std::vector<ValueId>{a.value} : a.values;
    for (ValueId id : ids) {
      if (id == tracer::kNoValue || !g.value(id).is_tensor) continue;
      const at::ScalarType t = g.value(id).meta.dtype;
      if (at::isFloatingType(t) || at::isComplexType(t)) return false;
    }
  }
  return true;
}

bool UsesDefaultDtype(const Graph& g) {
  for (const tracer::Node& n : g.nodes) {
    if (n.factory || PromotesToDefaultDtype(g, n)) return true;
    for (const NodeArg& a : n.args) {
      if (a.kind == NodeArg::Kind::kConstant && (a.constant.isDouble() ||
                                                 (a.constant.isScalar() && a.constant.toScalar().isFloatingPoint()))) {
        return true;
      }
      if (a.kind == NodeArg::Kind::kValue && !g.value(a.value).is_tensor &&
          g.value(a.value).traced_scalar.isDouble()) {
        return true;  // a symbolic double argument: promotes integer tensors to the default dtype
      }
    }
  }
  return false;
}

// Rewrites an expression over the pass's symbol ids into a relation guard's local numbering,
// appending the sources it needs to `symbols`.
tracer::SymExpr Localize(const tracer::SymExpr& e, const ops::ShapePassResult& shapes,
                         std::vector<std::pair<int, int>>* symbols) {
  constexpr int kTemp = 1 << 20;  // above any real id, so renaming cannot collide
  tracer::SymExpr out = e;
  std::vector<int> globals = e.symbols();
  for (int g : globals) {
    const auto source = std::make_pair(shapes.symbols[g].arg, shapes.symbols[g].dim);
    int local = -1;
    for (size_t k = 0; k < symbols->size(); ++k) {
      if ((*symbols)[k] == source) local = static_cast<int>(k);
    }
    if (local < 0) {
      local = static_cast<int>(symbols->size());
      symbols->push_back(source);
    }
    out = out.Substitute(g, tracer::SymExpr::Symbol(kTemp + local));
  }
  for (size_t k = 0; k < symbols->size(); ++k) {
    out = out.Substitute(kTemp + static_cast<int>(k), tracer::SymExpr::Symbol(static_cast<int>(k)));
  }
  return out;
}

// Solves e == 0 for one symbol that occurs linearly with coefficient +-1 (the newest such symbol,
// so that relations point at earlier arguments): returns (symbol, value) or nullopt.
std::optional<std::pair<int, tracer::SymExpr>> SolveLinear(const tracer::SymExpr& e) {
  std::vector<int> syms = e.symbols();
  for (auto it = syms.rbegin(); it != syms.rend(); ++it) {
    const int s = *it;
    const tracer::SymExpr rest = e.Substitute(s, tracer::SymExpr(0));
    auto coef = tracer::SymExpr::ExactDiv(e - rest, tracer::SymExpr::Symbol(s));
    if (!coef || !coef->is_constant()) continue;
    if (coef->constant() == 1) return std::make_pair(s, tracer::SymExpr(0) - rest);
    if (coef->constant() == -1) return std::make_pair(s, rest);
  }
  return std::nullopt;
}

}  // namespace

SymbolResolution ResolveSymbols(const ops::ShapePassResult& shapes) {
  SymbolResolution res;
  auto apply = [&](tracer::SymExpr e) {
    for (const auto& [s, value] : res.resolved) e = e.Substitute(s, value);
    return e;
  };
  for (const auto& req : shapes.requirements) {
    tracer::SymExpr e = apply(req.lhs - req.rhs);
    for (const auto& [s, why] : shapes.specialized) {
      e = e.Substitute(s, tracer::SymExpr(shapes.symbols[s].traced));
    }
    if (e.is_constant()) continue;  // held at trace time, so it is 0: implied by other guards
    auto solved = SolveLinear(e);
    if (!solved) {
      res.residual.push_back({e, req.why});
      continue;
    }
    const auto& [s, value] = *solved;
    for (auto& [t, v] : res.resolved) v = v.Substitute(s, value);
    res.resolved[s] = value;
    res.why[s] = req.why;
  }
  for (auto& [e, why] : res.residual) e = apply(e);
  return res;
}

std::vector<Guard> Dedupe(std::vector<Guard> guards) {
  std::set<std::string> seen;
  std::vector<Guard> out;
  for (Guard& g : guards) {
    int64_t value = g.expected;
    if (g.kind == GuardKind::kDoubleValue) std::memcpy(&value, &g.expected_double, 8);
    std::string key = absl::StrCat(static_cast<int>(g.kind), ":", g.arg, ":", g.dim, ":",
                                   g.other_arg, ":", value);
    if (g.kind == GuardKind::kSizeRelation) {
      absl::StrAppend(&key, ":", g.lhs.ToString(), "=", g.rhs.ToString());
      for (const auto& [a, d] : g.symbols) absl::StrAppend(&key, ":", a, ".", d);
    }
    if (!seen.insert(key).second) continue;
    out.push_back(std::move(g));
  }
  return out;
}

std::vector<Guard> BuildGuards(const BuildInput& in) {
  const Graph& g = *in.graph;
  const std::vector<c10::IValue>& args = *in.args;
  std::vector<Guard> out;
  auto add = [&](Guard guard) { out.push_back(std::move(guard)); };

  add({GuardKind::kGradMode, -1, -1, -1, c10::GradMode::is_enabled(), 0,
       "autograd recording of the replayed ops depends on it"});
  add({GuardKind::kInferenceMode, -1, -1, -1, c10::InferenceMode::is_enabled(), 0,
       "inference tensors and autograd state of the outputs depend on it"});
  // Note [Thread modes]: what the thread had set when the call began (autocast, below-autograd
  // guards, InferenceMode's key exclusions) decides what the recorded ops returned.
  add({GuardKind::kThreadIncludedKeys, -1, -1, -1, static_cast<int64_t>(g.entry_mode.included), 0,
       "thread-local dispatch state the recorded ops ran under"});
  add({GuardKind::kThreadExcludedKeys, -1, -1, -1, static_cast<int64_t>(g.entry_mode.excluded), 0,
       "thread-local dispatch state the recorded ops ran under (autocast, below-autograd guards)"});
  if (g.entry_mode.autocast_cpu_dtype >= 0) {
    add({GuardKind::kAutocastDtype, -1, -1, -1, g.entry_mode.autocast_cpu_dtype, 0,
         "autocast was on at the call: ops were cast to this dtype"});
  }
  if (UsesDefaultDtype(g)) {
    add({GuardKind::kDefaultDtype, -1, -1, -1,
         static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())), 0,
         "a factory op or a floating-point scalar may have taken the default dtype"});
  }
  add({GuardKind::kArgCount, -1, -1, -1, static_cast<int64_t>(args.size()), 0,
       "the function was traced with this many arguments"});

  const std::vector<std::string> first_use = FirstUse(g);
  std::map<std::pair<int, int>, int> symbol_of;
  SymbolResolution resolution;
  if (in.shapes != nullptr) {
    for (size_t s = 0; s < in.shapes->symbols.size(); ++s) {
      symbol_of[{in.shapes->symbols[s].arg, in.shapes->symbols[s].dim}] = static_cast<int>(s);
    }
    resolution = ResolveSymbols(*in.shapes);
  }
  // Sizes and strides read through wrappers, per argument.
  std::vector<std::string> size_read(args.size()), stride_read(args.size()), rank_read(args.size());
  std::string intermediate_stride_read;
  for (const tracer::MetadataRead& r : *in.reads) {
    const int arg = g.BaseArg(r.value);
    const bool is_input = g.value(r.value).kind == tracer::ValueKind::kInput;
    const std::string by = absl::StrCat("read by ", r.by);
    if (r.what == tracer::MetadataRead::What::kRank) {
      if (arg >= 0 && rank_read[arg].empty()) rank_read[arg] = absl::StrCat("dim() ", by);
    } else if (r.what == tracer::MetadataRead::What::kSizes) {
      // A size read on an intermediate needs nothing extra: every used argument's sizes are
      // guarded anyway under static shapes.
      if (arg >= 0 && size_read[arg].empty()) size_read[arg] = by;
    } else if (is_input) {
      if (stride_read[arg].empty()) stride_read[arg] = by;
    } else if (intermediate_stride_read.empty()) {
      intermediate_stride_read = absl::StrCat("strides of ", g.ValueName(r.value), " ", by);
    }
  }

  // Note [Argument identity]
  const std::vector<int32_t> same_as = IdentityOf(args);
  if (std::count_if(same_as.begin(), same_as.end(), [](int32_t s) { return s >= 0; }) >= 2) {
    Guard identity{GuardKind::kArgIdentity, -1, -1, -1, 0, 0,
                   "C++ code can compare tensor arguments (is_same, ==): the trace saw this identity"};
    identity.same_as = same_as;
    add(std::move(identity));
  }
  // Note [Captured tensors]
  for (const tracer::Value& v : g.values) {
    if (v.kind != tracer::ValueKind::kConstant || !v.constant.defined() ||
        v.constant.unsafeGetTensorImpl()->is_wrapped_number()) {
      continue;
    }
    Guard captured{GuardKind::kCapturedTensor, -1, static_cast<int>(v.id), -1, 0, 0,
                   "captured tensor: C++ code can read its metadata without the tracer seeing it"};
    CapturedTensor c = CapturedTensor::Of(v.constant, g.ValueName(v.id));
    // As the trace first saw it (Note [Metadata at entry]); the function may have changed it since.
    c.requires_grad = v.meta.requires_grad;
    if (c.plain) {
      c.sizes = v.meta.sizes;
      c.strides = v.meta.strides;
    }
    captured.captured = std::make_shared<const CapturedTensor>(std::move(c));
    add(std::move(captured));
  }

  for (size_t i = 0; i < args.size(); ++i) {
    const int a = static_cast<int>(i);
    const ArgType type = ArgTypeOf(args[i]);
    add({GuardKind::kArgType, a, -1, -1, static_cast<int64_t>(type), 0, "every argument's type is guarded"});
    // The argument's graph value, if the graph saw it; a tensor passed twice has the value of its
    // first occurrence (Note [Argument identity]).
    const int rep = same_as[i] >= 0 ? same_as[i] : a;
    const tracer::Value* value = static_cast<size_t>(rep) < g.arg_values.size() && g.arg_values[rep] != tracer::kNoValue
                                     ? &g.value(g.arg_values[rep])
                                     : nullptr;
    if (value != nullptr && !value->is_tensor) {
      continue;  // a symbolic scalar (Note [Symbolic scalars]): read by the graph, only its type guarded
    }
    switch (type) {
      case ArgType::kInt:
        add({GuardKind::kIntValue, a, -1, -1, args[i].toInt(), 0,
             "scalar arguments are specialized (static)"});
        continue;
      case ArgType::kBool:
        add({GuardKind::kBoolValue, a, -1, -1, args[i].toBool(), 0,
             "scalar arguments are specialized (static)"});
        continue;
      case ArgType::kDouble: {
        Guard d{GuardKind::kDoubleValue, a, -1, -1, 0, args[i].toDouble(),
                "scalar arguments are specialized (static)"};
        add(d);
        continue;
      }
      case ArgType::kTensor:
        break;
      default:
        continue;
    }
    const at::Tensor& t = args[i].toTensor();
    // Note [Metadata at entry]: the guards describe the argument as the call received it. The
    // traced call may have changed it in place since (add_ with an operand that requires grad
    // makes it require grad, an in-place view op changes its sizes), so requires_grad, rank,
    // sizes and strides are the graph's input metadata, recorded when the trace began; the live
    // tensor is used only for an argument the graph never saw.
    const tracer::TensorMeta entry = value != nullptr ? value->meta : tracer::TensorMeta::Of(t);
    const int64_t rank = static_cast<int64_t>(entry.sizes.size());
    const std::string meta = "tensor metadata is not observable to the tracer: always guarded";
    add({GuardKind::kDtype, a, -1, -1, static_cast<int64_t>(t.scalar_type()), 0, meta});
    add({GuardKind::kDispatchKeys, a, -1, -1, static_cast<int64_t>(t.unsafeGetTensorImpl()->key_set().raw_repr()), 0,
         "what kind of tensor it is (Note [Dispatch keys])"});
    add({GuardKind::kDevice, a, -1, -1,
         (static_cast<int64_t>(t.device().type()) << 16) | (static_cast<int64_t>(t.device().index()) & 0xffff),
         0, meta});
    add({GuardKind::kLayout, a, -1, -1, static_cast<int64_t>(t.layout()), 0, meta});
    add({GuardKind::kRequiresGrad, a, -1, -1, GradState(entry.requires_grad, entry.is_leaf), 0, meta});

    std::string why = !size_read[i].empty() ? size_read[i] : first_use[i];
    if (!why.empty()) {
      add({GuardKind::kRank, a, -1, -1, rank, 0, why});
      for (int64_t d = 0; d < rank; ++d) {
        const int dim = static_cast<int>(d);
        auto sym = symbol_of.find({a, dim});
        if (sym == symbol_of.end()) {
          add({GuardKind::kSize, a, dim, -1, entry.sizes[d], 0, absl::StrCat(why, " (static shapes)")});
          continue;
        }
        const int s = sym->second;
        if (auto sp = in.shapes->specialized.find(s); sp != in.shapes->specialized.end()) {
          add({GuardKind::kSize, a, dim, -1, entry.sizes[d], 0, sp->second});
          continue;
        }
        auto r = resolution.resolved.find(s);
        if (r == resolution.resolved.end()) {
          add({GuardKind::kSizeAtLeast, a, dim, -1, 2, 0,
               "dynamic dim (sizes 0 and 1 always specialize)"});
          continue;
        }
        if (r->second.is_constant()) {
          add({GuardKind::kSize, a, dim, -1, r->second.constant(), 0, resolution.why[s]});
          continue;
        }
        Guard rel{GuardKind::kSizeRelation, a, dim, -1, 0, 0, resolution.why[s]};
        rel.symbols.push_back({a, dim});
        rel.lhs = tracer::SymExpr::Symbol(0);
        rel.rhs = Localize(r->second, *in.shapes, &rel.symbols);
        add(std::move(rel));
        if (!r->second.as_symbol()) {
          add({GuardKind::kSizeAtLeast, a, dim, -1, 2, 0,
               "dynamic dim (sizes 0 and 1 always specialize)"});
        }
      }
    }
    if (why.empty() && !rank_read[i].empty()) {
      add({GuardKind::kRank, a, -1, -1, rank, 0, rank_read[i]});
    }
    std::string stride_why = stride_read[i];
    if (stride_why.empty() && !intermediate_stride_read.empty() && !first_use[i].empty()) {
      stride_why = intermediate_stride_read;
    }
    if (!stride_why.empty()) {
      if (why.empty()) add({GuardKind::kRank, a, -1, -1, rank, 0, stride_why});
      if (in.strides_verified) continue;
      for (int64_t d = 0; d < rank; ++d) {
        add({GuardKind::kStride, a, static_cast<int>(d), -1, entry.strides[d], 0, stride_why});
      }
    }
  }

  for (const auto& [e, why] : resolution.residual) {
    Guard rel{GuardKind::kSizeRelation, -1, -1, -1, 0, 0, why};
    rel.lhs = Localize(e, *in.shapes, &rel.symbols);
    rel.rhs = tracer::SymExpr(0);
    if (!rel.symbols.empty()) rel.arg = rel.symbols[0].first;
    add(std::move(rel));
  }

  const std::vector<int> mutated = g.MutatedArgs();
  for (int m : mutated) {
    for (size_t j = 0; j < args.size(); ++j) {
      if (static_cast<int>(j) == m || ArgTypeOf(args[j]) != ArgType::kTensor) continue;
      if (first_use[j].empty() && size_read[j].empty()) continue;
      const at::Tensor& tm = args[m].toTensor();
      const at::Tensor& tj = args[j].toTensor();
      const int lo = std::min<int>(m, j), hi = std::max<int>(m, j);
      add({GuardKind::kAliasing, lo, -1, hi, tm.is_alias_of(tj), 0,
           absl::StrCat("the graph writes '", g.arg_names[m], "'")});
    }
  }
  return Dedupe(std::move(out));
}

}  // namespace warden::guards
