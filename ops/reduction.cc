// Shape rules of reductions (sum, mean, max, var, norms, ...), scans (cumsum) and the softmax
// family. Reductions drop or keep (keepdim) the reduced dims; scans and softmax keep the shape.
// Values never matter here, except that ATen rejects some reductions of empty tensors (see below).

#include <initializer_list>

#include "ops/registry.h"

namespace warden::ops {
namespace {

using Shapes = std::vector<Shape>;

constexpr int kNoArg = -1;

// The shape after reducing `dims` of `in`. An empty `dims` means every dim: 1.13 reads `dim=[]`
// that way for sum, mean, amax, var and the rest (later releases deprecate it), and a None dim
// list is passed here as empty too. A rank-0 input accepts dim 0 or -1 and stays rank 0, keepdim
// or not.
absl::StatusOr<Shape> Reduce(const ShapeContext& ctx, const Shape& in,
                             const std::vector<int64_t>& dims, bool keepdim) {
  const int64_t rank = static_cast<int64_t>(in.size());
  std::vector<bool> reduced(in.size(), dims.empty());
  for (int64_t d : dims) {
    absl::StatusOr<int64_t> w = WrapDim(d, rank, ctx.op());
    if (!w.ok()) return w.status();
    if (rank == 0) continue;
    if (reduced[*w]) {
      return ShapeError(ctx, "dim ", *w, " appears multiple times in the list of dims");
    }
    reduced[*w] = true;
  }
  Shape out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!reduced[i]) {
      out.push_back(in[i]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

// A reduction of argument 0. `dims_arg` is the schema position of the dim (int, int[] or int?);
// kNoArg reduces everything. `keepdim_arg` likewise (kNoArg: keepdim=False). Ops returning
// (values, indices) or (var, mean) repeat the shape `outputs` times.
ShapeRule ReduceRule(int dims_arg, int keepdim_arg, int outputs = 1) {
  return [=](const ShapeContext& ctx) -> absl::StatusOr<Shapes> {
    std::vector<int64_t> dims;
    if (dims_arg != kNoArg && !ctx.is_none(dims_arg)) dims = ctx.Ints(dims_arg);
    const bool keepdim = keepdim_arg != kNoArg && ctx.Bool(keepdim_arg);
    absl::StatusOr<Shape> out = Reduce(ctx, ctx.shape(0), dims, keepdim);
    if (!out.ok()) return out.status();
    return Shapes(outputs, *out);
  };
}

// logsumexp(self, dim, keepdim). Note [logsumexp of dim=[]]: 1.13 reduces everything for an
// empty dim list but then adds the keepdim-shaped maxima into the reduced result in place, so a
// non-empty input of rank > 0 with keepdim=False fails ("output with shape [] doesn't match the
// broadcast shape [1, 1]"). Empty inputs take another path and succeed.
absl::StatusOr<Shapes> Logsumexp(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  const std::vector<int64_t> dims = ctx.Ints(1);
  const bool keepdim = ctx.Bool(2);
  if (dims.empty() && !keepdim && !in.empty() &&
      !SizeEquals(ctx, Numel(in), 0, "logsumexp of an empty tensor")) {
    return ShapeError(ctx, "dim=[] with keepdim=False fails in LibTorch 1.13 for a non-empty "
                      "tensor of rank > 0");
  }
  absl::StatusOr<Shape> out = Reduce(ctx, in, dims, keepdim);
  if (!out.ok()) return out.status();
  return Shapes{*out};
}

// Ops whose int dim must be valid but which keep the shape: scans and softmax.
ShapeRule SameWithDim(int dim_arg) {
  return [=](const ShapeContext& ctx) -> absl::StatusOr<Shapes> {
    const Shape& in = ctx.shape(0);
    absl::StatusOr<int64_t> d = WrapDim(ctx.Int(dim_arg), in.size(), ctx.op());
    if (!d.ok()) return d.status();
    return Shapes{in};
  };
}

}  // namespace

// Note [Empty reductions]: max, amax, argmax (and min) of a reduced dim of size 0 fail in ATen
// ("Expected reduction dim to be specified for input.numel() == 0"). The rules do not reproduce
// that: the eager run during tracing raises the same error first, and sizes 0 are specialized.
WARDEN_REGISTER_OPS(reduction) {
  auto add = [&r](std::initializer_list<const char*> names, const ShapeRule& rule) {
    for (const char* name : names) r.Add({name, rule});
  };

  // Full reductions to a 0-dim tensor.
  add({"aten::sum", "aten::mean", "aten::prod", "aten::max", "aten::min", "aten::all",
       "aten::any", "aten::var", "aten::std", "aten::norm.Scalar", "aten::norm.ScalarOpt_dtype",
       "aten::frobenius_norm"},
      ReduceRule(kNoArg, kNoArg));
  add({"aten::var_mean", "aten::std_mean"}, ReduceRule(kNoArg, kNoArg, 2));

  // (self, dim, keepdim, ...).
  add({"aten::sum.dim_IntList", "aten::mean.dim", "aten::amax", "aten::amin",
       "aten::prod.dim_int", "aten::all.dim", "aten::any.dim", "aten::argmax", "aten::argmin",
       "aten::frobenius_norm.dim"},
      ReduceRule(1, 2));
  r.Add({"aten::logsumexp", Logsumexp});
  add({"aten::max.dim", "aten::min.dim"}, ReduceRule(1, 2, 2));
  // aminmax(self, *, dim=None, keepdim=False) -> (min, max).
  r.Add({"aten::aminmax", ReduceRule(1, 2, 2)});
  // (self, dim, unbiased-or-correction, keepdim).
  add({"aten::var.dim", "aten::var.correction", "aten::std.dim", "aten::std.correction"},
      ReduceRule(1, 3));
  add({"aten::var_mean.dim", "aten::var_mean.correction", "aten::std_mean.dim",
       "aten::std_mean.correction"},
      ReduceRule(1, 3, 2));
  // (self, p, dim, keepdim, ...).
  add({"aten::norm.ScalarOpt_dim", "aten::norm.ScalarOpt_dim_dtype",
       "aten::linalg_vector_norm"},
      ReduceRule(2, 3));
  // count_nonzero never keeps dims; its int? overload counts everything when dim is None.
  add({"aten::count_nonzero", "aten::count_nonzero.dim_IntList"}, ReduceRule(1, kNoArg));

  // Scans and softmax: the dim is checked, the shape kept.
  add({"aten::cumsum", "aten::cumsum_", "aten::cumprod", "aten::cumprod_", "aten::softmax.int",
       "aten::log_softmax.int", "aten::_softmax", "aten::_log_softmax"},
      SameWithDim(1));
}

}  // namespace warden::ops
