// Straight-line programs for backend "cpp" (Note [Straight-line programs] in codegen_pointwise.h):
// which stretches of a graph become one generated function, where each value lives (an input, an
// output array, a scratch array, or a view of one of them) and the C source.
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/codegen_emit.h"

namespace warden::codegen::emit {
namespace {

using at::ScalarType;
using tracer::Graph;
using tracer::Node;
using tracer::NodeArg;
using tracer::NodeReturn;
using tracer::TensorMeta;
using tracer::Value;
using tracer::ValueId;

enum class Op : uint8_t {
  kElementwise,    // the op table, functional: a fresh array
  kInPlace,        // the op table, in-place form: writes its self
  kFill,           // fill_.Scalar / zero_ (self)
  kCopyInPlace,    // copy_(self, src)
  kFactory,        // *_like, zeros, ones, full, empty: a fresh array
  kView,           // index arithmetic on self's array
  kReduce,         // sum / mean
  kIndexSelect,
  kIndexAdd,
  kSelectScatter,
  kSliceScatter,
  kCopy,           // clone, _to_copy, to.dtype, contiguous, dropout in eval: a fresh array
  kMatmul,         // mm, addmm, bmm, matmul (2-D or batched, no vectors)
  kBatchNorm,      // batch_norm with running statistics, training=false
  kEmbedding,
  kSoftmax,        // softmax / log_softmax over one dim
  kLayerNorm,      // layer_norm over the last dim
};

// Multiply-adds a program's matmul may do. A real BLAS (LibTorch 2.x's bundled one) runs a
// [8, 256] x [256, 64] product (131K) in a few us, 2-5x faster than this loop; up to 16K the
// ATen call's own overhead (~2 us) is most of its time (measured: bench/models_bench on 2.13).
constexpr int64_t kMaxProgramMacs = int64_t{1} << 14;

// Note [Column reductions]: accumulators a column-form reduction keeps on the stack (16 KB of
// doubles).
constexpr int64_t kMaxColumnAccumulators = 2048;

struct Classified {
  Op op = Op::kElementwise;
  std::string fill;  // kFill / kFactory: the literal ("" for empty)
};

int64_t Numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

int64_t WrapDim(int64_t d, int64_t rank) {
  const int64_t r = std::max<int64_t>(rank, 1);
  return d < 0 ? d + r : d;
}

const c10::IValue& Arg(const Node& n, size_t i) { return n.args.at(i).constant; }

// The argument of `n` named `name` in its schema, or null.
const NodeArg* Named(const Node& n, const char* name) {
  const auto& args = n.handle->schema().arguments();
  for (size_t i = 0; i < args.size() && i < n.args.size(); ++i) {
    if (args[i].name() == name) return &n.args[i];
  }
  return nullptr;
}

// Factory arguments a program can honour: strided CPU memory, not pinned.
bool PlainFactoryArgs(const Node& n) {
  const NodeArg* layout = Named(n, "layout");
  const NodeArg* device = Named(n, "device");
  const NodeArg* pin = Named(n, "pin_memory");
  if (layout != nullptr && !layout->constant.isNone() &&
      (!layout->constant.isInt() || layout->constant.toInt() != static_cast<int64_t>(at::kStrided))) {
    return false;
  }
  if (device != nullptr && !device->constant.isNone() &&
      (!device->constant.isDevice() || !device->constant.toDevice().is_cpu())) {
    return false;
  }
  if (pin != nullptr && !pin->constant.isNone() && (!pin->constant.isBool() || pin->constant.toBool())) return false;
  return true;
}

const std::set<std::string>& ViewOps() {
  static const auto* ops = new std::set<std::string>{
      "aten::select.int", "aten::narrow",     "aten::slice.Tensor",   "aten::expand",   "aten::expand_as",
      "aten::detach",     "aten::alias",      "aten::unsqueeze",      "aten::squeeze",  "aten::squeeze.dim",
      "aten::view",       "aten::view_as",    "aten::_reshape_alias", "aten::reshape",  "aten::t",
      "aten::transpose.int", "aten::permute", "aten::requires_grad_",
  };
  return *ops;
}

// View ops that return their self tensor itself (when the tracer records them as a view).
bool ReturnsSelf(const std::string& op) {
  return op == "aten::contiguous" || op == "aten::to.dtype" || op == "aten::dropout";
}

// Conversions _to_copy may make: exact or as ATen's static_cast (no float -> integer or bool).
bool Convertible(ScalarType from, ScalarType to) {
  if (from == to || from == ScalarType::Bool) return true;
  return at::isFloatingType(to);
}

// Why node `n` cannot be part of a program on its own (before the stretch is known), or "".
std::string Blocker(const Graph& g, const Node& n, const std::vector<bool>& symbolic, bool history_free,
                    Classified* c) {
  if (!n.handle) return "no operator";
  for (const NodeArg& a : n.args) {
    if (!a.sizes_of.empty() || !a.sym_elems.empty()) return "sizes read at run time";
  }
  if (n.random) return "random";
  if (n.kind == tracer::NodeKind::kDataDependent) return "data-dependent";
  if (n.mode) return "thread-local mode";
  if (n.returns.size() != 1 || n.returns[0].kind != NodeReturn::Kind::kTensor || n.returns[0].values.size() != 1) {
    return "returns";
  }
  auto is_static = [&](ValueId id) { return static_cast<size_t>(id) >= symbolic.size() || !symbolic[id]; };
  const ValueId out = n.returns[0].values[0];
  const Value& ov = g.value(out);
  const TensorMeta& m = ov.meta;
  if (!IsFusedDtype(m.dtype) || !m.device.is_cpu() || !is_static(out) || m.strides.size() != m.sizes.size() ||
      Numel(m.sizes) > kMaxProgramElements) {
    return "result";
  }
  // With grad mode off nothing is recorded (a view of a parameter still says requires_grad).
  if (m.requires_grad && !history_free && g.entry_mode.grad_mode) return "result requires grad";
  // to.dtype returns self when nothing changes (a view here), else a converted copy.
  const bool to_self = (n.op == "aten::to.dtype" || n.op == "aten::contiguous" || n.op == "aten::dropout") &&
                       ov.alias_of != tracer::kNoValue;
  const bool view = ViewOps().count(n.op) > 0 || to_self;
  for (ValueId v : tracer::InputValues(n)) {
    if (v == tracer::kNoValue) return "undefined operand";
    const TensorMeta& im = g.value(v).meta;
    const bool big_ok = (view || n.op == "aten::index_select" || n.op == "aten::embedding") && v == n.args[0].value;
    if (!IsFusedDtype(im.dtype) || !im.device.is_cpu() || !is_static(v) || im.strides.size() != im.sizes.size() ||
        (!big_ok && Numel(im.sizes) > kMaxProgramElements)) {
      return "operand";
    }
  }
  for (const NodeArg& a : n.args) {
    if (a.kind == NodeArg::Kind::kValueList || a.kind == NodeArg::Kind::kOptValueList) return "tensor list";
  }
  if (n.op == "aten::dropout" && Arg(n, 2).isBool() && Arg(n, 2).toBool()) return "dropout in training";
  const ValueId self = !n.args.empty() && n.args[0].kind == NodeArg::Kind::kValue ? n.args[0].value : tracer::kNoValue;
  if (view) {
    if (self == tracer::kNoValue || ov.alias_of != self) return "view of an unexpected value";
    if (g.value(self).meta.dtype != m.dtype) return "view changes the dtype";
    c->op = Op::kView;
    return "";
  }
  if (n.op == "aten::fill_.Scalar" || n.op == "aten::zero_") {
    if (self == tracer::kNoValue || ov.alias_of != self) return "in-place result";
    double value = 0;
    if (n.op == "aten::zero_") {
      c->fill = m.dtype == ScalarType::Bool ? "false" : LiteralOf(0, m.dtype);
    } else if (!ScalarLiteralOf(Arg(n, 1), m.dtype, &c->fill, &value)) {
      return "fill value";
    }
    c->op = Op::kFill;
    return "";
  }
  if (n.op == "aten::copy_") {
    if (self == tracer::kNoValue || ov.alias_of != self || n.args[1].kind != NodeArg::Kind::kValue) return "copy_";
    if (!Convertible(g.value(n.args[1].value).meta.dtype, m.dtype)) return "conversion";
    c->op = Op::kCopyInPlace;
    return "";
  }
  if (!IsContiguous(m.sizes, m.strides) && !n.mutates) return "non-contiguous result";
  static const std::map<std::string, double>* kLike = new std::map<std::string, double>{
      {"aten::zeros_like", 0}, {"aten::ones_like", 1}, {"aten::empty_like", -1}, {"aten::full_like", 2},
      {"aten::zeros", 0},      {"aten::ones", 1},      {"aten::empty.memory_format", -1}, {"aten::full", 2}};
  if (auto it = kLike->find(n.op); it != kLike->end()) {
    if (!PlainFactoryArgs(n) || ov.alias_of != tracer::kNoValue) return "factory arguments";
    double value = 0;
    if (it->second == 2) {
      if (!ScalarLiteralOf(Arg(n, 1), m.dtype, &c->fill, &value)) return "fill value";
    } else if (it->second >= 0) {
      c->fill = m.dtype == ScalarType::Bool ? (it->second != 0 ? "true" : "false") : LiteralOf(it->second, m.dtype);
    }
    c->op = Op::kFactory;
    return "";
  }
  if (n.op == "aten::sum" || n.op == "aten::sum.dim_IntList" || n.op == "aten::mean" || n.op == "aten::mean.dim") {
    const bool mean = n.op.rfind("aten::mean", 0) == 0;
    const ScalarType in = g.value(self).meta.dtype;
    if (!Arg(n, n.args.size() - 1).isNone() || in != m.dtype || in == ScalarType::Bool ||
        (mean && !at::isFloatingType(in))) {
      return "reduction dtype";
    }
    c->op = Op::kReduce;
    return "";
  }
  if (n.op == "aten::index_select" || n.op == "aten::index_add") {
    const ValueId index = n.args[2].value;
    if (n.args[2].kind != NodeArg::Kind::kValue || g.value(index).meta.dtype != ScalarType::Long ||
        g.value(index).meta.sizes.size() > 1 || g.value(self).meta.sizes.empty()) {
      return "index";
    }
    if (n.op == "aten::index_add") {
      std::string text;
      double alpha;
      if (!ScalarLiteralOf(Arg(n, 4), m.dtype, &text, &alpha)) return "alpha";
      const TensorMeta& source = g.value(n.args[3].value).meta;
      if (source.dtype != m.dtype || source.sizes.size() != m.sizes.size()) return "source dtype or rank";
    }
    c->op = n.op == "aten::index_select" ? Op::kIndexSelect : Op::kIndexAdd;
    return "";
  }
  if (n.op == "aten::select_scatter" || n.op == "aten::slice_scatter") {
    if (g.value(n.args[1].value).meta.dtype != m.dtype || g.value(self).meta.sizes.empty()) return "scatter";
    c->op = n.op == "aten::select_scatter" ? Op::kSelectScatter : Op::kSliceScatter;
    return "";
  }
  if (n.op == "aten::mm" || n.op == "aten::addmm" || n.op == "aten::bmm" || n.op == "aten::matmul") {
    const bool addmm = n.op == "aten::addmm";
    const TensorMeta& a = g.value(n.args[addmm ? 1 : 0].value).meta;
    const TensorMeta& b = g.value(n.args[addmm ? 2 : 1].value).meta;
    if (!at::isFloatingType(m.dtype) || a.dtype != m.dtype || b.dtype != m.dtype || a.sizes.size() < 2 ||
        b.sizes.size() < 2 || m.sizes.size() != std::max(a.sizes.size(), b.sizes.size())) {
      return "matmul operands";
    }
    const int64_t k = a.sizes.back();
    if (b.sizes[b.sizes.size() - 2] != k || Numel(m.sizes) * std::max<int64_t>(k, 1) > kMaxProgramMacs) {
      return "matmul size";
    }
    if (addmm) {
      std::string text;
      double v;
      if (g.value(n.args[0].value).meta.dtype != m.dtype || !ScalarLiteralOf(Arg(n, 3), m.dtype, &text, &v) ||
          !ScalarLiteralOf(Arg(n, 4), m.dtype, &text, &v)) {
        return "addmm scalars";
      }
    }
    c->op = Op::kMatmul;
    return "";
  }
  if (n.op == "aten::batch_norm") {
    // (input, weight?, bias?, running_mean?, running_var?, training, momentum, eps, cudnn_enabled)
    if (!Arg(n, 5).isBool() || Arg(n, 5).toBool() || n.args[3].kind != NodeArg::Kind::kValue ||
        n.args[4].kind != NodeArg::Kind::kValue || m.sizes.size() < 2 || !at::isFloatingType(m.dtype) ||
        !Arg(n, 7).isDouble()) {
      return "batch_norm in training or without running statistics";
    }
    for (int a = 1; a <= 4; ++a) {
      if (n.args[a].kind != NodeArg::Kind::kValue) continue;
      const TensorMeta& p = g.value(n.args[a].value).meta;
      if (p.dtype != m.dtype || p.sizes != std::vector<int64_t>{m.sizes[1]}) return "batch_norm parameters";
    }
    std::string eps;
    double eps_v;
    if (!ScalarLiteralOf(Arg(n, 7), m.dtype, &eps, &eps_v)) return "batch_norm eps";
    c->op = Op::kBatchNorm;
    return "";
  }
  if (n.op == "aten::embedding") {
    const TensorMeta& idx = g.value(n.args[1].value).meta;
    if (idx.dtype != ScalarType::Long || g.value(self).meta.sizes.size() != 2) return "embedding";
    c->op = Op::kEmbedding;
    return "";
  }
  if (n.op == "aten::softmax.int" || n.op == "aten::log_softmax.int") {
    if (!at::isFloatingType(m.dtype) || g.value(self).meta.dtype != m.dtype || !Arg(n, 2).isNone() ||
        m.sizes.empty()) {
      return "softmax dtype";
    }
    c->op = Op::kSoftmax;
    return "";
  }
  if (n.op == "aten::layer_norm") {
    // (input, normalized_shape, weight?, bias?, eps, cudnn_enable): over the last dim only.
    const std::vector<int64_t> shape = Arg(n, 1).toIntVector();
    if (shape.size() != 1 || m.sizes.empty() || shape[0] != m.sizes.back() || shape[0] < 1 ||
        !at::isFloatingType(m.dtype) || !Arg(n, 4).isDouble()) {
      return "layer_norm shape";
    }
    for (int a = 2; a <= 3; ++a) {
      if (n.args[a].kind != NodeArg::Kind::kValue) continue;
      const TensorMeta& p = g.value(n.args[a].value).meta;
      if (p.dtype != m.dtype || p.sizes != shape) return "layer_norm parameters";
    }
    std::string eps;
    double eps_v;
    if (!ScalarLiteralOf(Arg(n, 4), m.dtype, &eps, &eps_v)) return "layer_norm eps";
    c->op = Op::kLayerNorm;
    return "";
  }
  if (n.op == "aten::dropout" && (!Arg(n, 2).isBool() || Arg(n, 2).toBool())) return "dropout in training";
  if (n.op == "aten::clone" || n.op == "aten::_to_copy" || n.op == "aten::to.dtype" || n.op == "aten::contiguous" ||
      n.op == "aten::dropout") {
    if (n.op == "aten::_to_copy" && !PlainFactoryArgs(n)) return "copy arguments";
    if (!Convertible(g.value(self).meta.dtype, m.dtype)) return "conversion";
    c->op = Op::kCopy;
    return "";
  }
  const std::string why = ElementwiseBlocker(g, n, true);
  if (!why.empty()) return why;
  if (n.mutates) {
    if (self == tracer::kNoValue || ov.alias_of != self) return "in-place result";
    // ATen computes an in-place op in the operands' common dtype, then rounds to self's; the
    // program computes in self's: only the same dtype everywhere is exact.
    for (ValueId v : tracer::InputValues(n)) {
      if (g.value(v).meta.dtype != m.dtype) return "in-place op with operands of another dtype";
    }
    c->op = Op::kInPlace;
  } else {
    if (ov.alias_of != tracer::kNoValue) return "result is a view";
    c->op = Op::kElementwise;
  }
  return "";
}

// Where a value lives: element `offset` of an array (base >= 0: the array the program made for
// value `base`; else input `input`) with `sizes` and element `strides`.
struct Loc {
  ValueId base = tracer::kNoValue;
  int input = -1;
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
  bool Same(const Loc& o) const {
    return base == o.base && input == o.input && offset == o.offset && sizes == o.sizes && strides == o.strides;
  }
};

// The planned stretch [first, last]: locations, or the nodes that must leave it.
struct Sim {
  std::map<ValueId, Loc> loc;
  std::vector<ValueId> inputs;
  std::set<int> block;
};

// Per value: the last node reading it (-1: none) and whether the graph returns it.
void Uses(const Graph& g, std::vector<int>* last_user, std::vector<bool>* returned) {
  last_user->assign(g.values.size(), -1);
  for (const Node& n : g.nodes) {
    for (ValueId v : tracer::InputValues(n)) {
      if (v != tracer::kNoValue) (*last_user)[v] = std::max((*last_user)[v], n.index);
    }
  }
  returned->assign(g.values.size(), false);
  for (ValueId id : g.outputs) {
    if (id != tracer::kNoValue) (*returned)[id] = true;
  }
}

bool Escapes(ValueId v, int last, const std::vector<int>& last_user, const std::vector<bool>& returned) {
  return last_user[v] > last || returned[v];
}

// Element offset of a view `n` (select/narrow/slice) into self's array.
int64_t ViewDelta(const Graph& g, const Node& n, const Loc& self) {
  if (n.op != "aten::select.int" && n.op != "aten::narrow" && n.op != "aten::slice.Tensor") return 0;
  const int64_t rank = static_cast<int64_t>(self.sizes.size());
  const int64_t d = WrapDim(Arg(n, 1).toInt(), rank);
  const int64_t size = self.sizes.at(d);
  int64_t start = 0;
  if (n.op == "aten::slice.Tensor") {
    const c10::IValue& s = Arg(n, 2);
    start = s.isNone() ? 0 : s.toInt();
    if (start < 0) start += size;
    start = std::clamp<int64_t>(start, 0, size);
  } else {
    start = Arg(n, 2).toInt();
    if (start < 0) start += size;
  }
  (void)g;
  return start * self.strides.at(d);
}

Sim Simulate(const Graph& g, int first, int last, const std::vector<Classified>& cls,
             const std::vector<int>& last_user, const std::vector<bool>& returned) {
  Sim s;
  auto loc_of = [&](ValueId v) -> const Loc& {
    auto it = s.loc.find(v);
    if (it != s.loc.end()) return it->second;
    Loc l;
    l.input = static_cast<int>(s.inputs.size());
    l.sizes = g.value(v).meta.sizes;
    l.strides = g.value(v).meta.strides;
    s.inputs.push_back(v);
    return s.loc.emplace(v, l).first->second;
  };
  for (int i = first; i <= last; ++i) {
    const Node& n = g.nodes[i];
    const ValueId out = n.returns[0].values[0];
    const TensorMeta& m = g.value(out).meta;
    for (ValueId v : tracer::InputValues(n)) loc_of(v);
    const Op op = cls[i].op;
    if (op == Op::kView) {
      Loc l = loc_of(n.args[0].value);
      l.offset += ViewDelta(g, n, l);
      l.sizes = m.sizes;
      l.strides = m.strides;
      s.loc[out] = l;
    } else if (op == Op::kInPlace || op == Op::kFill || op == Op::kCopyInPlace) {
      const Loc self = loc_of(n.args[0].value);
      if (self.base == tracer::kNoValue) s.block.insert(i);  // writes a value from before the program
      for (size_t d = 0; d < self.sizes.size(); ++d) {
        if (self.sizes[d] > 1 && self.strides[d] == 0) s.block.insert(i);  // ATen refuses the write
      }
      for (ValueId v : tracer::InputValues(n)) {
        const Loc& o = loc_of(v);
        if (v != n.args[0].value && o.base == self.base && o.input == self.input && !o.Same(self)) s.block.insert(i);
      }
      s.loc[out] = self;
    } else {
      Loc l;
      l.base = out;
      l.sizes = m.sizes;
      l.strides = ContiguousStrides(m.sizes);
      s.loc[out] = l;
    }
  }
  // Which values are one TensorImpl: an in-place result, requires_grad_'s, and a view that
  // returns self (contiguous, to(same dtype), eval dropout) are their self's tensor.
  std::map<ValueId, ValueId> impl;  // value -> the value whose TensorImpl it is
  auto impl_of = [&](ValueId v) {
    auto it = impl.find(v);
    return it == impl.end() ? v : it->second;
  };
  for (int i = first; i <= last; ++i) {
    const Node& n = g.nodes[i];
    const bool same_impl = cls[i].op == Op::kInPlace || cls[i].op == Op::kFill || cls[i].op == Op::kCopyInPlace ||
                           n.op == "aten::requires_grad_" || (cls[i].op == Op::kView && ReturnsSelf(n.op));
    if (same_impl) impl[n.returns[0].values[0]] = impl_of(n.args[0].value);
  }
  // Values read after the program: whole arrays it made (Note [Straight-line programs]), through
  // one TensorImpl per array: the array's own (its base value, in-place results on it) or a single
  // detach/alias of it. The array is handed out as that tensor, which requires no grad.
  std::map<ValueId, std::set<ValueId>> impls_of_base;
  for (int i = first; i <= last; ++i) {
    const ValueId out = g.nodes[i].returns[0].values[0];
    if (!Escapes(out, last, last_user, returned)) continue;
    const Loc& l = s.loc.at(out);
    const bool whole = l.base != tracer::kNoValue && l.offset == 0 && l.sizes == g.value(l.base).meta.sizes &&
                       l.strides == ContiguousStrides(l.sizes);
    const ValueId root = impl_of(out);
    const Value& rv = g.value(root);
    const bool identity = root == l.base || (rv.kind == tracer::ValueKind::kNode && rv.node >= first &&
                                             (g.nodes[rv.node].op == "aten::detach" || g.nodes[rv.node].op == "aten::alias"));
    if (!whole || !identity || (returned[out] && g.value(out).meta.requires_grad)) {
      s.block.insert(i);
      continue;
    }
    impls_of_base[l.base].insert(root);
  }
  for (const auto& [base, roots] : impls_of_base) {
    if (roots.size() < 2) continue;
    for (ValueId r : roots) {
      if (r != base) s.block.insert(g.value(r).node);  // a detach beside the array's own tensor
    }
  }
  // requires_grad_ changes its self's TensorImpl (not the storage): fine on a tensor the program
  // made that nobody sees after it; not on a value from before it, or on one (or the same tensor
  // under another value) read after it.
  for (int i = first; i <= last; ++i) {
    const Node& n = g.nodes[i];
    if (n.op != "aten::requires_grad_") continue;
    const ValueId root = impl_of(n.args[0].value);
    const Value& rv = g.value(root);
    bool seen = rv.kind != tracer::ValueKind::kNode || rv.node < first;
    for (int j = first; j <= last && !seen; ++j) {
      const ValueId out = g.nodes[j].returns[0].values[0];
      seen = impl_of(out) == root && Escapes(out, last, last_user, returned);
    }
    if (seen) s.block.insert(i);
  }
  return s;
}

std::string Ptr(const Loc& l) { return l.base != tracer::kNoValue ? absl::StrCat("b", l.base) : absl::StrCat("in", l.input); }

// The element index of `l` broadcast (right-aligned) into a loop over `shape` with variables i<d>.
std::string Index(const Loc& l, size_t rank) {
  std::vector<std::string> terms;
  if (l.offset != 0 || l.sizes.empty()) terms.push_back(absl::StrCat(l.offset));
  const size_t lead = rank - l.sizes.size();
  for (size_t d = 0; d < l.sizes.size(); ++d) {
    if (l.sizes[d] == 1 || l.strides[d] == 0) continue;
    terms.push_back(l.strides[d] == 1 ? absl::StrCat("i", lead + d) : absl::StrCat("i", lead + d, " * ", l.strides[d]));
  }
  return terms.empty() ? "0" : absl::StrJoin(terms, " + ");
}

std::string At(const Loc& l, size_t rank) { return absl::StrCat(Ptr(l), "[", Index(l, rank), "]"); }

// Loops over `shape` around `body` (lines already indented for the innermost level).
std::string Nest(const std::vector<int64_t>& shape, const std::string& body, const std::string& pragma) {
  std::string s = "  {\n";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d + 1 == shape.size() && !pragma.empty()) absl::StrAppend(&s, "#pragma omp simd", pragma, "\n");
    absl::StrAppend(&s, "  for (int64_t i", d, " = 0; i", d, " < ", shape[d], "; ++i", d, ") {\n");
  }
  absl::StrAppend(&s, body);
  for (size_t d = 0; d < shape.size(); ++d) absl::StrAppend(&s, "  }\n");
  absl::StrAppend(&s, "  }\n");
  return s;
}

// A copy of `l` where loop variable `var` replaces dim `d`'s index (for index_select/index_add).
std::string IndexWith(const Loc& l, size_t rank, int64_t d, const std::string& var) {
  Loc other = l;
  other.sizes[d] = 1;  // drop the dim from Index(); added back as `var`
  std::string s = Index(other, rank);
  if (l.strides[d] != 0) absl::StrAppend(&s, " + (", var, ") * ", l.strides[d]);
  return s;
}

// Every element of the index array `idx` checked against [0, size) before anything reads through
// it: ATen checks them all, even when the result is empty.
std::string BoundsCheck(const Loc& idx, int64_t size) {
  const size_t rank = idx.sizes.size();
  return Nest(idx.sizes, absl::StrCat("    const int64_t ix = ", At(idx, rank), ";\n    if (ix < 0 || ix >= ", size,
                                      ") return 1;\n"), "");
}

std::string Cast(ScalarType to, ScalarType from, const std::string& x) {
  if (to == from) return x;
  if (to == ScalarType::Bool) return absl::StrCat("(", x, " != 0)");
  return absl::StrCat("static_cast<", CType(to), ">(", x, ")");
}

// The loads of `values` (each once) into v<id> inside a loop over `rank` dims.
std::string Loads(const Graph& g, const Sim& s, const std::vector<ValueId>& values, size_t rank) {
  std::string out;
  std::set<ValueId> seen;
  for (ValueId v : values) {
    if (!seen.insert(v).second) continue;
    absl::StrAppend(&out, "    const ", CType(g.value(v).meta.dtype), " v", v, " = ", At(s.loc.at(v), rank), ";\n");
  }
  return out;
}

}  // namespace

std::vector<ProgramRegion> PlanPrograms(const Graph& g, const std::vector<bool>& symbolic_shape,
                                        const std::vector<bool>& history_free, const std::vector<bool>& reserved) {
  const int count = static_cast<int>(g.nodes.size());
  std::vector<Classified> cls(count);
  std::vector<bool> ok(count, false);
  for (int i = 0; i < count; ++i) {
    const bool free = static_cast<size_t>(i) < history_free.size() && history_free[i];
    ok[i] = Blocker(g, g.nodes[i], symbolic_shape, free, &cls[i]).empty() &&
            !(static_cast<size_t>(i) < reserved.size() && reserved[i]);
  }
  std::vector<int> last_user;
  std::vector<bool> returned;
  Uses(g, &last_user, &returned);

  // Stretches of eligible nodes; a node a stretch cannot hold leaves it, until nothing changes.
  std::vector<std::pair<int, int>> runs;
  for (bool changed = true; changed;) {
    changed = false;
    runs.clear();
    for (int i = 0; i < count;) {
      if (!ok[i]) {
        ++i;
        continue;
      }
      int j = i;
      while (j + 1 < count && ok[j + 1]) ++j;
      runs.push_back({i, j});
      i = j + 1;
    }
    for (const auto& [first, last] : runs) {
      const Sim s = Simulate(g, first, last, cls, last_user, returned);
      for (int b : s.block) {
        ok[b] = false;
        changed = true;
      }
    }
  }

  std::vector<ProgramRegion> programs;
  for (const auto& [first, last] : runs) {
    // Worth a program: a node pointwise regions cannot run (else the stretch is theirs: they
    // also handle large and symbolic shapes), and at least two nodes that compute.
    int computing = 0;
    bool other = false;
    for (int i = first; i <= last; ++i) {
      const Node& n = g.nodes[i];
      if (cls[i].op != Op::kView) ++computing;
      const bool pointwise = (cls[i].op == Op::kElementwise && ElementwiseBlocker(g, n, false).empty()) ||
                             ((cls[i].op == Op::kReduce || cls[i].op == Op::kSoftmax || cls[i].op == Op::kLayerNorm) &&
                              ReductionOf(g, n).kind != ReductionKind::kNone);
      other |= !pointwise;
    }
    if (computing < 2 || !other) continue;
    const Sim s = Simulate(g, first, last, cls, last_user, returned);
    ProgramRegion p;
    for (int i = first; i <= last; ++i) p.nodes.push_back(i);
    p.inputs = s.inputs;
    std::map<ValueId, int> out_index;
    for (int i = first; i <= last; ++i) {
      const ValueId out = g.nodes[i].returns[0].values[0];
      if (!Escapes(out, last, last_user, returned)) continue;
      const ValueId base = s.loc.at(out).base;
      auto [it, added] = out_index.emplace(base, static_cast<int>(p.outputs.size()));
      if (added) p.outputs.push_back(base);
      p.results.push_back({out, it->second});
    }
    p.output_writes.assign(p.outputs.size(), 0);
    for (int i = first; i <= last; ++i) {
      if (cls[i].op != Op::kInPlace && cls[i].op != Op::kFill && cls[i].op != Op::kCopyInPlace) continue;
      auto it = out_index.find(s.loc.at(g.nodes[i].args[0].value).base);
      if (it != out_index.end()) ++p.output_writes[it->second];
    }
    // Scratch: every other array the program made that is read outside the loop making it.
    for (int i = first; i <= last; ++i) {
      const ValueId out = g.nodes[i].returns[0].values[0];
      if (s.loc.at(out).base != out || out_index.count(out)) continue;
      p.scratch_bytes += (Numel(g.value(out).meta.sizes) * static_cast<int64_t>(c10::elementSize(g.value(out).meta.dtype)) + 63) / 64 * 64;
    }
    if (p.scratch_bytes > kMaxProgramScratchBytes) continue;
    programs.push_back(std::move(p));
  }
  return programs;
}

std::string ProgramSource(const Graph& g, const ProgramRegion& p) {
  const int first = p.nodes.front(), last = p.nodes.back();
  std::vector<int> last_user;
  std::vector<bool> returned;
  Uses(g, &last_user, &returned);
  std::vector<Classified> cls(g.nodes.size());
  for (int i = first; i <= last; ++i) Blocker(g, g.nodes[i], {}, true, &cls[i]);
  const Sim s = Simulate(g, first, last, cls, last_user, returned);

  // Loops: consecutive elementwise nodes of one result shape. A factory with a fill value
  // (zeros_like, full, ...) joins them as a constant (Note [Constant factories]).
  std::vector<int> group(g.nodes.size(), -1);
  auto in_loop = [&](int i) {
    return cls[i].op == Op::kElementwise || (cls[i].op == Op::kFactory && !cls[i].fill.empty());
  };
  for (int i = first; i <= last; ++i) {
    if (!in_loop(i)) continue;
    const bool joins = i > first && group[i - 1] >= 0 &&
                       g.value(g.nodes[i - 1].returns[0].values[0]).meta.sizes ==
                           g.value(g.nodes[i].returns[0].values[0]).meta.sizes;
    group[i] = joins ? group[i - 1] : i;
  }
  // Arrays: a value made by a loop needs one if something outside that loop reads it.
  std::set<ValueId> stored;
  std::map<ValueId, int> out_of;
  for (size_t k = 0; k < p.outputs.size(); ++k) out_of[p.outputs[k]] = static_cast<int>(k);
  for (int i = first; i <= last; ++i) {
    const ValueId out = g.nodes[i].returns[0].values[0];
    if (s.loc.at(out).base != out) continue;
    bool needed = !in_loop(i) || out_of.count(out) > 0;
    for (int j = i + 1; j <= last && !needed; ++j) {
      if (group[j] >= 0 && group[j] == group[i]) continue;
      for (ValueId v : tracer::InputValues(g.nodes[j])) needed |= v == out;
    }
    if (needed) stored.insert(out);
  }

  std::vector<std::string> ops;
  for (int i : p.nodes) ops.push_back(g.nodes[i].op);
  std::string src = absl::StrCat("// Program %", first, "..%", last, ": ", absl::StrJoin(ops, ", "), "\n");
  absl::StrAppend(&src, "extern \"C\" int ", p.function, "(const void** in, void** out, char* scratch) {\n");
  for (size_t k = 0; k < p.inputs.size(); ++k) {
    const char* t = CType(g.value(p.inputs[k]).meta.dtype);
    absl::StrAppend(&src, "  const ", t, "* __restrict in", k, " = static_cast<const ", t, "*>(in[", k, "]);  // ",
                    CanonicalName(g, p.inputs[k]), "\n");
  }
  int64_t offset = 0;
  for (ValueId v : stored) {
    const char* t = CType(g.value(v).meta.dtype);
    if (auto it = out_of.find(v); it != out_of.end()) {
      absl::StrAppend(&src, "  ", t, "* __restrict b", v, " = static_cast<", t, "*>(out[", it->second, "]);  // ",
                      CanonicalName(g, v), "\n");
      continue;
    }
    absl::StrAppend(&src, "  ", t, "* __restrict b", v, " = reinterpret_cast<", t, "*>(scratch + ", offset,
                    ");  // ", CanonicalName(g, v), "\n");
    offset += (Numel(g.value(v).meta.sizes) * static_cast<int64_t>(c10::elementSize(g.value(v).meta.dtype)) + 63) / 64 * 64;
  }
  absl::StrAppend(&src, "  (void)scratch;\n  (void)out;\n");

  for (int i = first; i <= last;) {
    const Node& n = g.nodes[i];
    const ValueId out = n.returns[0].values[0];
    const TensorMeta& m = g.value(out).meta;
    const Loc& result = s.loc.at(out);
    const size_t rank = m.sizes.size();
    const char* t = CType(m.dtype);
    switch (group[i] >= 0 ? Op::kElementwise : cls[i].op) {
      case Op::kView:
        ++i;
        continue;
      case Op::kElementwise: {
        // Note [Constant factories]: a factory in the loop is a constant of its dtype (it reads
        // nothing of its argument but the shape, which the group shares); it is stored only if
        // something outside the loop reads it.
        std::vector<int> members, nodes, factories;
        for (int j = i; j <= last && group[j] == group[i]; ++j) {
          members.push_back(j);
          (cls[j].op == Op::kFactory ? factories : nodes).push_back(j);
        }
        std::set<ValueId> made;
        std::vector<ValueId> loads;
        for (int j : factories) made.insert(g.nodes[j].returns[0].values[0]);
        for (int j : nodes) {
          for (int a = 0; a < TensorOperands(g.nodes[j]); ++a) {
            const ValueId v = g.nodes[j].args[a].value;
            if (!made.count(v)) loads.push_back(v);
          }
          made.insert(g.nodes[j].returns[0].values[0]);
        }
        std::string body = Loads(g, s, loads, rank);
        for (int j : factories) {
          const ValueId v = g.nodes[j].returns[0].values[0];
          absl::StrAppend(&body, "    const ", CType(g.value(v).meta.dtype), " v", v, " = ", cls[j].fill, ";  // %", j,
                          " = ", g.nodes[j].op, "\n");
        }
        absl::StrAppend(&body, NodeStatements(g, nodes, "    "));
        for (int j : members) {
          const ValueId v = g.nodes[j].returns[0].values[0];
          if (stored.count(v)) absl::StrAppend(&body, "    ", At(s.loc.at(v), rank), " = v", v, ";\n");
        }
        absl::StrAppend(&src, "  // %", members.front(), "..%", members.back(), " on ", tracer::ShapeString(m.sizes),
                        "\n", Nest(m.sizes, body, " "));
        i = members.back() + 1;
        continue;
      }
      case Op::kInPlace: {
        std::vector<ValueId> loads;
        for (int a = 0; a < TensorOperands(n); ++a) loads.push_back(n.args[a].value);
        std::string body = Loads(g, s, loads, rank);
        absl::StrAppend(&body, NodeStatements(g, {i}, "    "), "    ", At(result, rank), " = v", out, ";\n");
        absl::StrAppend(&src, "  // %", i, " = ", n.op, "\n", Nest(m.sizes, body, " "));
        break;
      }
      case Op::kFill:
      case Op::kFactory:
        if (!cls[i].fill.empty()) {
          absl::StrAppend(&src, "  // %", i, " = ", n.op, "\n",
                          Nest(m.sizes, absl::StrCat("    ", At(result, rank), " = ", cls[i].fill, ";\n"), " "));
        }
        break;
      case Op::kCopy:
      case Op::kCopyInPlace: {
        const ValueId src_v = n.args[cls[i].op == Op::kCopy ? 0 : 1].value;
        const std::string x = At(s.loc.at(src_v), rank);
        absl::StrAppend(&src, "  // %", i, " = ", n.op, "\n",
                        Nest(m.sizes, absl::StrCat("    ", At(result, rank), " = ",
                                                   Cast(m.dtype, g.value(src_v).meta.dtype, x), ";\n"), " "));
        break;
      }
      case Op::kReduce: {
        const ValueId in = n.args[0].value;
        const Loc& l = s.loc.at(in);
        const int64_t in_rank = static_cast<int64_t>(l.sizes.size());
        std::vector<bool> reduced(in_rank, n.op == "aten::sum" || n.op == "aten::mean");
        if (n.op == "aten::sum.dim_IntList" || n.op == "aten::mean.dim") {
          const c10::IValue& dims = Arg(n, 1);
          std::vector<int64_t> list = dims.isNone() ? std::vector<int64_t>() : dims.toIntVector();
          if (list.empty()) std::fill(reduced.begin(), reduced.end(), true);
          for (int64_t d : list) {
            if (in_rank > 0) reduced[WrapDim(d, in_rank)] = true;
          }
        }
        int64_t count = 1;
        for (int64_t d = 0; d < in_rank; ++d) count *= reduced[d] ? l.sizes[d] : 1;
        const bool floating = at::isFloatingType(m.dtype);
        const char* acc = floating ? "double" : "int64_t";
        const bool mean = n.op.rfind("aten::mean", 0) == 0;
        // The result array indexed by the input's loop variables (reduced dims stride 0).
        Loc target;
        target.base = result.base;
        target.sizes = l.sizes;
        {
          std::vector<int64_t> contiguous = ContiguousStrides(m.sizes);
          size_t r = 0;
          const bool keepdim = m.sizes.size() == l.sizes.size();
          for (int64_t d = 0; d < in_rank; ++d) {
            if (reduced[d]) {
              target.strides.push_back(0);
              if (keepdim) ++r;
            } else {
              target.strides.push_back(contiguous.at(r++));
            }
          }
        }
        auto finish_of = [&](const std::string& a) {
          return mean ? absl::StrCat("static_cast<", t, ">(", a, ") / ", LiteralOf(static_cast<double>(count), m.dtype))
                      : absl::StrCat("static_cast<", t, ">(", a, ")");
        };
        const std::string finish = finish_of("acc");
        // Note [Column reductions]: when the input's innermost dim is kept (a sum over the rows of
        // a matrix, as every bias gradient is), one accumulator per result element lives in an
        // array, the loops run over the input in its own order and the innermost one over vector
        // lanes, each lane adding into its own accumulator. The reduced-innermost form below
        // would walk the input with a stride and a single dependent chain per result element.
        // Each accumulator adds its elements in increasing index order, in double (int64_t for
        // integers) as below.
        const int64_t kept_count = Numel(m.sizes);
        if (in_rank >= 2 && !reduced[in_rank - 1] && count > 1 && kept_count <= kMaxColumnAccumulators) {
          const std::string col = absl::StrCat("col", out);
          std::string code = absl::StrCat("  // %", i, " = ", n.op, " (column form)\n  {\n  ", acc, " ", col, "[",
                                          kept_count, "];\n  for (int64_t k = 0; k < ", kept_count, "; ++k) ", col,
                                          "[k] = 0;\n");
          absl::StrAppend(&code, Nest(l.sizes, absl::StrCat("    ", col, "[", Index(target, in_rank), "] += ",
                                                             At(l, in_rank), ";\n"), " "));
          absl::StrAppend(&code, "  for (int64_t k = 0; k < ", kept_count, "; ++k) ", Ptr(result), "[k] = ",
                          finish_of(absl::StrCat(col, "[k]")), ";\n  }\n");
          absl::StrAppend(&src, code);
          break;
        }
        // Loops over the kept dims outside, one accumulator (double for floating dtypes) per
        // result element, the reduced dims inside (the innermost over vector lanes).
        std::string code = absl::StrCat("  // %", i, " = ", n.op, "\n  {\n");
        int open = 0;
        for (int pass = 0; pass < 2; ++pass) {
          if (pass == 1) absl::StrAppend(&code, "  ", acc, " acc = 0;\n");
          std::vector<int64_t> dims;
          for (int64_t d = 0; d < in_rank; ++d) {
            if (reduced[d] == (pass == 1)) dims.push_back(d);
          }
          for (size_t j = 0; j < dims.size(); ++j) {
            if (pass == 1 && j + 1 == dims.size()) absl::StrAppend(&code, "#pragma omp simd reduction(+:acc)\n");
            absl::StrAppend(&code, "  for (int64_t i", dims[j], " = 0; i", dims[j], " < ", l.sizes[dims[j]], "; ++i",
                            dims[j], ") {\n");
          }
          if (pass == 1) {
            absl::StrAppend(&code, "    acc += ", At(l, in_rank), ";\n");
            for (size_t j = 0; j < dims.size(); ++j) absl::StrAppend(&code, "  }\n");
            absl::StrAppend(&code, "  ", Ptr(result), "[", Index(target, in_rank), "] = ", finish, ";\n");
          } else {
            open = static_cast<int>(dims.size());
          }
        }
        for (int j = 0; j < open; ++j) absl::StrAppend(&code, "  }\n");
        absl::StrAppend(&src, code, "  }\n");
        break;
      }
      case Op::kIndexSelect: {
        const Loc& self = s.loc.at(n.args[0].value);
        const Loc& index = s.loc.at(n.args[2].value);
        const int64_t d = WrapDim(Arg(n, 1).toInt(), static_cast<int64_t>(self.sizes.size()));
        const std::string ix = index.sizes.empty() ? Index(index, 0) : absl::StrCat(index.offset, " + i", d, " * ", index.strides[0]);
        std::string body = absl::StrCat("    const int64_t ix = ", Ptr(index), "[", ix, "];\n");
        absl::StrAppend(&body, "    ", At(result, rank), " = ", Ptr(self), "[", IndexWith(self, rank, d, "ix"), "];\n");
        absl::StrAppend(&src, "  // %", i, " = ", n.op, "\n", BoundsCheck(index, self.sizes[d]), Nest(m.sizes, body, ""));
        break;
      }
      case Op::kIndexAdd: {
        const Loc& self = s.loc.at(n.args[0].value);
        const Loc& index = s.loc.at(n.args[2].value);
        const Loc& source = s.loc.at(n.args[3].value);
        const int64_t d = WrapDim(Arg(n, 1).toInt(), static_cast<int64_t>(self.sizes.size()));
        std::string alpha;
        double alpha_value = 1;
        ScalarLiteralOf(Arg(n, 4), m.dtype, &alpha, &alpha_value);
        absl::StrAppend(&src, "  // %", i, " = ", n.op, "\n", BoundsCheck(index, m.sizes[d]),
                        Nest(m.sizes, absl::StrCat("    ", At(result, rank), " = ", At(self, rank), ";\n"), " "));
        // Over the source's positions: index entry i<d> names the row of the result it adds to.
        const std::string ix = index.sizes.empty() ? Index(index, 0) : absl::StrCat(index.offset, " + i", d, " * ", index.strides[0]);
        Loc dst = result;
        dst.sizes = source.sizes;
        std::string body = absl::StrCat("    const int64_t ix = ", Ptr(index), "[", ix, "];\n");
        const std::string x = At(source, rank);
        absl::StrAppend(&body, "    ", Ptr(result), "[", IndexWith(dst, rank, d, "ix"), "] += ",
                        alpha_value == 1 ? x : absl::StrCat(alpha, " * ", x), ";\n");
        absl::StrAppend(&src, Nest(source.sizes, body, ""));
        break;
      }
      case Op::kMatmul: {
        const bool addmm = n.op == "aten::addmm";
        const Loc& a = s.loc.at(n.args[addmm ? 1 : 0].value);
        const Loc& b = s.loc.at(n.args[addmm ? 2 : 1].value);
        const size_t ra = a.sizes.size(), rb = b.sizes.size();
        const int64_t k = a.sizes[ra - 1];
        // Over the result's (batch..., M, N): a's K position and b's K position drop out (size 1)
        // and come back as the inner loop's k.
        Loc av = a, bv = b;
        av.sizes[ra - 1] = 1;
        bv.sizes[rb - 2] = 1;
        // In the dtype, as BLAS accumulates, over vector lanes (another order than BLAS's).
        std::string body = absl::StrCat("    ", t, " acc = 0;\n#pragma omp simd reduction(+:acc)\n",
                                        "    for (int64_t k = 0; k < ", k, "; ++k) {\n", "      acc += ",
                                        Ptr(a), "[", Index(av, rank), " + k * ", a.strides[ra - 1], "] * ", Ptr(b), "[",
                                        Index(bv, rank), " + k * ", b.strides[rb - 2], "];\n    }\n");
        std::string value = "acc";
        if (addmm) {
          std::string beta, alpha;
          double beta_v = 1, alpha_v = 1;
          ScalarLiteralOf(Arg(n, 3), m.dtype, &beta, &beta_v);
          ScalarLiteralOf(Arg(n, 4), m.dtype, &alpha, &alpha_v);
          if (alpha_v != 1) value = absl::StrCat(alpha, " * ", value);
          // beta == 0: the bias is not read (NaN and Inf in it are ignored), as in ATen.
          if (beta_v != 0) {
            const std::string bias = At(s.loc.at(n.args[0].value), rank);
            value = absl::StrCat(beta_v == 1 ? bias : absl::StrCat(beta, " * ", bias), " + ", value);
          }
        }
        absl::StrAppend(&body, "    ", At(result, rank), " = ", value, ";\n");
        absl::StrAppend(&src, "  // %", i, " = ", n.op, "\n", Nest(m.sizes, body, ""));
        break;
      }
      case Op::kBatchNorm: {
        // ATen's eval transform: alpha = weight / sqrt(var + eps), beta = bias - mean * alpha,
        // out = x * alpha + beta, per channel (dim 1).
        const Loc& x = s.loc.at(n.args[0].value);
        auto channel = [&](int a) {  // a [C] operand over the result's dims
          Loc l = s.loc.at(n.args[a].value);
          for (size_t d = 2; d < rank; ++d) {
            l.sizes.push_back(1);
            l.strides.push_back(0);
          }
          return At(l, rank);
        };
        std::string eps;
        double eps_v;
        ScalarLiteralOf(Arg(n, 7), m.dtype, &eps, &eps_v);
        const bool fl = m.dtype == ScalarType::Float;
        std::string body = absl::StrCat("    const ", t, " inv = ", LiteralOf(1, m.dtype), " / ",
                                        fl ? "__builtin_sqrtf(" : "__builtin_sqrt(", channel(4), " + ", eps, ");\n");
        const bool w = n.args[1].kind == NodeArg::Kind::kValue, bb = n.args[2].kind == NodeArg::Kind::kValue;
        absl::StrAppend(&body, "    const ", t, " al = ", w ? absl::StrCat("inv * ", channel(1)) : "inv", ";\n");
        absl::StrAppend(&body, "    const ", t, " be = ", bb ? channel(2) : LiteralOf(0, m.dtype), " - ", channel(3),
                        " * al;\n");
        absl::StrAppend(&body, "    ", At(result, rank), " = ", At(x, rank), " * al + be;\n");
        absl::StrAppend(&src, "  // %", i, " = ", n.op, "\n", Nest(m.sizes, body, " "));
        break;
      }
      case Op::kEmbedding: {
        const Loc& w = s.loc.at(n.args[0].value);
        const Loc& indices = s.loc.at(n.args[1].value);
        Loc idx = indices;
        idx.sizes.push_back(1);  // the embedding dim
        idx.strides.push_back(0);
        absl::StrAppend(&src, BoundsCheck(indices, w.sizes[0]));
        std::string body = absl::StrCat("    const int64_t ix = ", At(idx, rank), ";\n");
        absl::StrAppend(&body, "    ", At(result, rank), " = ", Ptr(w), "[", w.offset, " + ix * ", w.strides[0],
                        " + i", rank - 1, " * ", w.strides[1], "];\n");
        absl::StrAppend(&src, "  // %", i, " = ", n.op, "\n", Nest(m.sizes, body, ""));
        break;
      }
      case Op::kSoftmax:
      case Op::kLayerNorm: {
        const Loc& x = s.loc.at(n.args[0].value);
        const int64_t d = cls[i].op == Op::kSoftmax ? WrapDim(Arg(n, 1).toInt(), static_cast<int64_t>(rank))
                                                    : static_cast<int64_t>(rank) - 1;
        const int64_t size = m.sizes[d];
        std::vector<int64_t> outer = m.sizes;
        outer[d] = 1;
        const std::string xr = absl::StrCat(Ptr(x), "[", IndexWith(x, rank, d, "r"), "]");
        const std::string yr = absl::StrCat(Ptr(result), "[", IndexWith(result, rank, d, "r"), "]");
        const bool fl = m.dtype == ScalarType::Float;
        const std::string loop = absl::StrCat("    for (int64_t r = 0; r < ", size, "; ++r) ");
        std::string body;
        if (cls[i].op == Op::kSoftmax) {
          const bool log = n.op == "aten::log_softmax.int";
          absl::StrAppend(&body, "    ", t, " mx = -__builtin_inf", fl ? "f" : "", "();\n    int nan = 0;\n", loop,
                          "{\n      const ", t, " v = ", xr, ";\n      mx = v > mx ? v : mx;\n      nan |= v != v;\n    }\n",
                          "    if (nan) mx = __builtin_nan", fl ? "f" : "", "(\"\");\n    ", t, " sum = 0;\n", loop,
                          "sum += ", fl ? "expf(" : "exp(", xr, " - mx);\n");
          if (log) {
            absl::StrAppend(&body, "    const ", t, " ls = ", fl ? "logf" : "log", "(sum);\n", loop, yr, " = ", xr,
                            " - mx - ls;\n");
          } else {
            absl::StrAppend(&body, "    const ", t, " inv = ", LiteralOf(1, m.dtype), " / sum;\n", loop, yr, " = ",
                            fl ? "expf(" : "exp(", xr, " - mx) * inv;\n");
          }
        } else {
          std::string eps;
          double eps_v;
          ScalarLiteralOf(Arg(n, 4), m.dtype, &eps, &eps_v);
          auto param = [&](int a) {  // weight / bias [D] over the result's dims, at position r
            Loc l = s.loc.at(n.args[a].value);
            return absl::StrCat(Ptr(l), "[", l.offset, " + r * ", l.strides[0], "]");
          };
          absl::StrAppend(&body, "    double sum = 0;\n", loop, "sum += ", xr, ";\n",
                          "    const double mean = sum / ", size, ";\n    double sq = 0;\n", loop,
                          "{\n      const double t = ", xr, " - mean;\n      sq += t * t;\n    }\n",
                          "    const ", t, " rstd = ", LiteralOf(1, m.dtype), " / ", fl ? "__builtin_sqrtf(" : "__builtin_sqrt(",
                          "static_cast<", t, ">(sq / ", size, ") + ", eps, ");\n",
                          "    const ", t, " mu = static_cast<", t, ">(mean);\n", loop, "{\n      ", t, " y = ", xr,
                          " * rstd - rstd * mu;\n");
          if (n.args[2].kind == NodeArg::Kind::kValue) absl::StrAppend(&body, "      y = y * ", param(2), ";\n");
          if (n.args[3].kind == NodeArg::Kind::kValue) absl::StrAppend(&body, "      y = y + ", param(3), ";\n");
          absl::StrAppend(&body, "      ", yr, " = y;\n    }\n");
        }
        absl::StrAppend(&src, "  // %", i, " = ", n.op, "\n", Nest(outer, body, ""));
        break;
      }
      case Op::kSelectScatter:
      case Op::kSliceScatter: {
        const Loc& self = s.loc.at(n.args[0].value);
        const Loc& source = s.loc.at(n.args[1].value);
        const int64_t d = WrapDim(Arg(n, 2).toInt(), static_cast<int64_t>(rank));
        absl::StrAppend(&src, "  // %", i, " = ", n.op, "\n",
                        Nest(m.sizes, absl::StrCat("    ", At(result, rank), " = ", At(self, rank), ";\n"), " "));
        Loc dst = result;
        const int64_t size = m.sizes[d];
        if (cls[i].op == Op::kSelectScatter) {
          int64_t index = Arg(n, 3).toInt();
          if (index < 0) index += size;
          dst.offset += index * dst.strides[d];
          dst.sizes.erase(dst.sizes.begin() + d);
          dst.strides.erase(dst.strides.begin() + d);
        } else {
          int64_t start = Arg(n, 3).isNone() ? 0 : Arg(n, 3).toInt();
          if (start < 0) start += size;
          start = std::clamp<int64_t>(start, 0, size);
          const int64_t step = Arg(n, 5).toInt();
          dst.offset += start * dst.strides[d];
          dst.strides[d] *= step;
          dst.sizes = source.sizes;
        }
        const size_t src_rank = source.sizes.size();
        absl::StrAppend(&src, Nest(source.sizes, absl::StrCat("    ", At(dst, src_rank), " = ", At(source, src_rank), ";\n"), ""));
        break;
      }
    }
    ++i;
  }
  absl::StrAppend(&src, "  return 0;\n}\n");
  return src;
}

}  // namespace warden::codegen::emit
