// Note [Verified size reads]: the per-entry set of verified read sizes, generalizing two traces
// into one graph with run-time sizes, and the instance check of a trace against that graph.
#include "runtime/verified_sizes.h"

#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/symbolic_scalars.h"

namespace warden::runtime {
namespace {

using tracer::Graph;
using tracer::NodeArg;
using tracer::Value;
using tracer::ValueId;

// A tuple element (VerifiedSizes::StrideDim): size(dim) for dim >= 0, stride(-1 - dim) below. The
// entry's guards fix the rank of every argument whose sizes are in the tuple; an argument whose
// strides are may be one the graph does not use (no rank guard): past its rank, a value no traced
// tuple holds.
int64_t SizeOf(const c10::IValue& arg, int dim) {
  const at::Tensor& t = arg.toTensor();
  if (dim >= 0) return t.size(dim);
  return -1 - dim < t.dim() ? t.stride(-1 - dim) : std::numeric_limits<int64_t>::min();
}

// The traced size (or, for a negative dim, stride) of argument `arg` in `g` (-1 when it is not a
// tensor of that rank).
int64_t TracedSize(const Graph& g, int arg, int dim) {
  if (arg < 0 || arg >= static_cast<int>(g.arg_values.size()) || g.arg_values[arg] == tracer::kNoValue) return -1;
  const auto& meta = g.value(g.arg_values[arg]).meta;
  const auto& ints = dim >= 0 ? meta.sizes : meta.strides;
  const int k = dim >= 0 ? dim : -1 - dim;
  return k < static_cast<int>(ints.size()) ? ints[k] : -1;
}

// Same value apart from sizes and strides (those are checked against the symbolic shapes).
std::string ValueDifference(const Graph& s, const Value& a, const Value& b) {
  const std::string name = s.ValueName(a.id);
  if (a.kind != b.kind || a.is_tensor != b.is_tensor || a.arg_index != b.arg_index || a.node != b.node ||
      a.output_index != b.output_index || a.alias_of != b.alias_of) {
    return absl::StrCat(name, " is produced differently");
  }
  if (a.is_tensor && (a.meta.dtype != b.meta.dtype || a.meta.device != b.meta.device ||
                      a.meta.requires_grad != b.meta.requires_grad || a.meta.sizes.size() != b.meta.sizes.size())) {
    return absl::StrCat(name, " has another dtype, device, rank or requires_grad");
  }
  if (!a.is_tensor && !SameIValue(a.traced_scalar, b.traced_scalar)) {
    return absl::StrCat(name, " (a data-dependent value) differs");
  }
  if (a.kind == tracer::ValueKind::kConstant && a.constant.unsafeGetTensorImpl() != b.constant.unsafeGetTensorImpl()) {
    return absl::StrCat(name, " captures another tensor");
  }
  return "";
}

// Everything but op-argument constants and value sizes: the same program.
std::string StructureDifference(const Graph& x, const std::vector<tracer::MetadataRead>& x_reads, const Graph& y,
                                const std::vector<tracer::MetadataRead>& y_reads) {
  if (x.nodes.size() != y.nodes.size() || x.values.size() != y.values.size()) {
    return absl::StrCat("it records ", y.nodes.size(), " ops instead of ", x.nodes.size(), " (a branch on the size?)");
  }
  if (x.outputs != y.outputs || x.arg_values != y.arg_values || x.arg_kinds != y.arg_kinds) {
    return "its arguments or outputs differ";
  }
  if (!(x.entry_mode == y.entry_mode) || x.mode_dependent != y.mode_dependent) return "its thread-local modes differ";
  if (!(x.sym_leaves == y.sym_leaves) || !(x.sym_checks == y.sym_checks)) {
    return "C++ compared other sizes, or got other answers (a branch on the size?)";
  }
  for (size_t i = 0; i < x.values.size(); ++i) {
    std::string d = ValueDifference(x, x.values[i], y.values[i]);
    if (!d.empty()) return d;
  }
  if (x_reads.size() != y_reads.size()) return "it reads other sizes or strides";
  for (size_t i = 0; i < x_reads.size(); ++i) {
    const tracer::MetadataRead& a = x_reads[i];
    const tracer::MetadataRead& b = y_reads[i];
    if (a.value != b.value || a.what != b.what || a.dim != b.dim) return "it reads other sizes or strides";
  }
  for (size_t n = 0; n < x.nodes.size(); ++n) {
    const tracer::Node& p = x.nodes[n];
    const tracer::Node& q = y.nodes[n];
    if (p.op != q.op || p.kind != q.kind || p.args.size() != q.args.size() || p.random != q.random ||
        p.mutates != q.mutates || !(p.mode == q.mode)) {
      return absl::StrCat("%", n, " is ", p.op, " in one trace and ", q.op, " in the other (a branch on the size?)");
    }
    for (size_t k = 0; k < p.args.size(); ++k) {
      const NodeArg& s = p.args[k];
      const NodeArg& t = q.args[k];
      if (s.kind != t.kind || s.value != t.value || s.values != t.values) {
        return absl::StrCat("the operands of ", p.op, " at %", n, " differ");
      }
      if (!(s.sym_elems == t.sym_elems)) {
        return absl::StrCat("argument ", k, " of ", p.op, " at %", n, " is computed from other sizes");
      }
    }
  }
  return "";
}

}  // namespace

VerifiedSizes::VerifiedSizes(std::vector<std::pair<int, int>> dims, std::vector<std::string> names)
    : dims_(std::move(dims)), names_(std::move(names)) {
  owned_.push_back(std::make_unique<std::vector<int64_t>>());
  current_.store(owned_.back().get(), std::memory_order_release);
}

bool VerifiedSizes::Check(const c10::IValue* args) const {
  const std::vector<int64_t>& set = *current_.load(std::memory_order_acquire);
  const size_t width = dims_.size();
  if (width == 0) return true;
  // Binary search over the sorted tuples (flattened, `width` ints each), without allocating.
  size_t lo = 0, hi = set.size() / width;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    int cmp = 0;
    for (size_t k = 0; k < width && cmp == 0; ++k) {
      const int64_t have = set[mid * width + k];
      const int64_t want = SizeOf(args[dims_[k].first], dims_[k].second);
      cmp = have < want ? -1 : (have > want ? 1 : 0);
    }
    if (cmp == 0) return true;
    if (cmp < 0) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return false;
}

std::vector<int64_t> VerifiedSizes::TupleOf(const c10::IValue* args) const {
  std::vector<int64_t> tuple;
  for (const auto& [arg, dim] : dims_) tuple.push_back(SizeOf(args[arg], dim));
  return tuple;
}

std::vector<int64_t> VerifiedSizes::TupleOf(const Graph& traced) const {
  std::vector<int64_t> tuple;
  for (const auto& [arg, dim] : dims_) tuple.push_back(TracedSize(traced, arg, dim));
  return tuple;
}

void VerifiedSizes::Add(const std::vector<int64_t>& tuple) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::vector<int64_t>> tuples = Values();
  if (std::find(tuples.begin(), tuples.end(), tuple) != tuples.end()) return;
  tuples.push_back(tuple);
  std::sort(tuples.begin(), tuples.end());
  auto next = std::make_unique<std::vector<int64_t>>();
  for (const auto& t : tuples) next->insert(next->end(), t.begin(), t.end());
  current_.store(next.get(), std::memory_order_release);
  owned_.push_back(std::move(next));  // readers may still hold the old set: it lives with the entry
}

std::vector<std::vector<int64_t>> VerifiedSizes::Values() const {
  const std::vector<int64_t>& set = *current_.load(std::memory_order_acquire);
  std::vector<std::vector<int64_t>> out;
  const size_t width = std::max<size_t>(dims_.size(), 1);
  for (size_t i = 0; i + width <= set.size(); i += width) out.emplace_back(set.begin() + i, set.begin() + i + width);
  return out;
}

std::string VerifiedSizes::ValuesText() const {
  std::vector<std::string> values;
  for (const auto& t : Values()) {
    values.push_back(t.size() == 1 ? absl::StrCat(t[0]) : absl::StrCat("(", absl::StrJoin(t, ", "), ")"));
  }
  return absl::StrJoin(values, ", ");
}

std::string VerifiedSizes::TupleText(const std::vector<int64_t>& tuple) const {
  std::vector<std::string> parts;
  for (size_t k = 0; k < tuple.size() && k < names_.size(); ++k) parts.push_back(absl::StrCat(names_[k], "=", tuple[k]));
  return absl::StrJoin(parts, ", ");
}

std::string VerifiedSizes::Failure(const c10::IValue* args) const {
  if (Check(args)) return "";
  return absl::StrCat(TupleText(TupleOf(args)), " is read by C++ code and not yet verified for this entry (verified: ",
                      ValuesText(), ")");
}

std::shared_ptr<Graph> Generalize(const tracer::TraceResult& now, const tracer::TraceResult& before,
                                  const std::vector<std::pair<int, int>>& read_dims, std::string* why) {
  const Graph& y = *now.graph;
  const Graph& x = *before.graph;
  *why = StructureDifference(x, before.reads, y, now.reads);
  if (!why->empty()) return nullptr;
  auto out = std::make_shared<Graph>(y);
  // Which read size an element is: the read dim with that value in both traces, else the read dim
  // of which it is the same integer multiple k >= 2 in both (batch * heads); the first one if
  // several match. A wrong pick only fails verification later (InstanceMismatch).
  auto match = [&](int64_t a, int64_t b, tracer::SizeRef* ref) {
    for (const bool multiple : {false, true}) {
      for (const auto& [arg, dim] : read_dims) {
        if (dim < 0) continue;  // a stride: verified, never an op argument
        const int64_t xs = TracedSize(x, arg, dim), ys = TracedSize(y, arg, dim);
        int64_t scale = 1;
        if (multiple) {
          if (xs < 1 || ys < 1 || a % xs != 0 || b % ys != 0) continue;
          scale = a / xs;
          if (scale < 2 || b / ys != scale) continue;
        } else if (xs != a || ys != b) {
          continue;
        }
        ref->arg = arg;
        ref->dim = dim;
        ref->scale = scale;
        return true;
      }
    }
    return false;
  };
  for (size_t n = 0; n < y.nodes.size(); ++n) {
    for (size_t k = 0; k < y.nodes[n].args.size(); ++k) {
      const NodeArg& p = x.nodes[n].args[k];
      NodeArg& q = out->nodes[n].args[k];
      if (q.kind != NodeArg::Kind::kConstant || SameIValue(p.constant, q.constant)) continue;
      const std::string where = absl::StrCat("argument ", k, " of ", y.nodes[n].op, " at %", n);
      // Elements C++ computed from symbolic sizes (the same expressions in both traces): the
      // shape pass makes them run-time sizes or specializes them (Note [Symbolic sizes]).
      auto computed = [&](int elem) {
        for (const tracer::SymElem& e : q.sym_elems) {
          if (e.elem == elem) return true;
        }
        return false;
      };
      if (p.constant.isInt() && q.constant.isInt()) {
        if (computed(-1)) continue;
        tracer::SizeRef ref;
        if (!match(p.constant.toInt(), q.constant.toInt(), &ref)) {
          *why = absl::StrCat(where, " changes but is not a size C++ read (computed from one?)");
          return nullptr;
        }
        q.sizes_of.push_back(ref);
        continue;
      }
      if (!p.constant.isIntList() || !q.constant.isIntList() ||
          p.constant.toIntVector().size() != q.constant.toIntVector().size()) {
        *why = absl::StrCat(where, " differs");
        return nullptr;
      }
      const std::vector<int64_t> a = p.constant.toIntVector(), b = q.constant.toIntVector();
      for (size_t e = 0; e < a.size(); ++e) {
        if (a[e] == b[e] || computed(static_cast<int>(e))) continue;
        tracer::SizeRef ref;
        ref.elem = static_cast<int>(e);
        if (!match(a[e], b[e], &ref)) {
          *why = absl::StrCat("element ", e, " of ", where, " changes but is not a size C++ read (computed from one?)");
          return nullptr;
        }
        q.sizes_of.push_back(ref);
      }
    }
  }
  return out;
}

std::string InstanceMismatch(const Graph& s, const std::vector<tracer::MetadataRead>& s_reads,
                             const ops::ShapePassResult& shapes, const tracer::TraceResult& trace) {
  if (!trace.untraceable.empty() || trace.rerun_eagerly) return "the new trace was abandoned";
  const Graph& t = *trace.graph;
  std::string d = StructureDifference(s, s_reads, t, trace.reads);
  if (!d.empty()) return d;
  // Symbol values at this call.
  std::vector<int64_t> values(shapes.symbols.size());
  for (size_t k = 0; k < shapes.symbols.size(); ++k) {
    values[k] = TracedSize(t, shapes.symbols[k].arg, shapes.symbols[k].dim);
    if (values[k] < 2) return "a symbolic size is 0 or 1";
  }
  for (size_t n = 0; n < s.nodes.size(); ++n) {
    for (size_t k = 0; k < s.nodes[n].args.size(); ++k) {
      const NodeArg& p = s.nodes[n].args[k];
      const NodeArg& q = t.nodes[n].args[k];
      if (p.kind != NodeArg::Kind::kConstant) continue;
      c10::IValue want = p.constant;
      if (!p.sizes_of.empty()) {
        if (!want.isIntList()) {
          want = c10::IValue(TracedSize(t, p.sizes_of[0].arg, p.sizes_of[0].dim) * p.sizes_of[0].scale);
        } else {
          std::vector<int64_t> ints = want.toIntVector();
          for (const tracer::SizeRef& r : p.sizes_of) ints[r.elem] = TracedSize(t, r.arg, r.dim) * r.scale;
          want = c10::IValue(ints);
        }
      }
      if (!SameIValue(want, q.constant)) {
        return absl::StrCat("argument ", k, " of ", s.nodes[n].op, " at %", n, " is ", tracer::IValueString(q.constant),
                            ", not ", tracer::IValueString(want));
      }
    }
  }
  for (const Value& v : t.values) {
    if (!v.is_tensor || static_cast<size_t>(v.id) >= shapes.shapes.size()) continue;
    const ops::Shape& sym = shapes.shapes[v.id];
    if (sym.size() != v.meta.sizes.size()) return absl::StrCat(s.ValueName(v.id), " has another rank");
    for (size_t dim = 0; dim < sym.size(); ++dim) {
      int64_t want = 0;
      if (!sym[dim].TryEvaluate(values.data(), &want) || want != v.meta.sizes[dim]) {
        return absl::StrCat(s.ValueName(v.id), ".size(", dim, ") is ", v.meta.sizes[dim], ", not ",
                            sym[dim].ToString(), " = ", want);
      }
    }
  }
  return "";
}

}  // namespace warden::runtime
