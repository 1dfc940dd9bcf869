// Shape rules of views and reshapes: view/reshape (with -1), flatten/unflatten, permutations,
// squeeze/unsqueeze, expand, slicing (slice, select, narrow, diagonal) and as_strided. Joining
// and splitting live in join.cc, gathers and scatters in indexing.cc.

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>

#include "ops/registry.h"

namespace warden::ops {
namespace {

using Shapes = std::vector<Shape>;

absl::StatusOr<Shapes> One(absl::StatusOr<Shape> shape) {
  if (!shape.ok()) return shape.status();
  return Shapes{*std::move(shape)};
}

// ATen's infer_size: `sizes` may hold one -1, solved so the element count stays `numel`.
// Sizes may be symbolic (argument sizes read at run time, ShapeContext::Dims); those are >= 2.
absl::StatusOr<Shape> InferSize(const ShapeContext& ctx, const std::vector<Dim>& sizes, Dim numel) {
  Shape out(sizes.begin(), sizes.end());
  Dim known = 1;
  int infer = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!sizes[i].is_constant()) {
      known = known * sizes[i];
    } else if (sizes[i].constant() == -1) {
      if (infer >= 0) return ShapeError(ctx, "only one dimension can be inferred");
      infer = static_cast<int>(i);
    } else if (sizes[i].constant() >= 0) {
      known = known * sizes[i];
    } else {
      return ShapeError(ctx, "invalid shape dimension ", sizes[i].constant());
    }
  }
  if (infer < 0) {
    absl::Status st = ctx.RequireEqual(known, numel, "reshape keeps the number of elements");
    if (!st.ok()) return st;
    return out;
  }
  if (known == 0) {
    return ShapeError(ctx, "cannot reshape a tensor of 0 elements into a shape with -1: the "
                      "unspecified dimension size can be any value and is ambiguous");
  }
  out[infer] = DivFloor(ctx, numel, known, "reshape infers the -1 dim");
  absl::Status st = ctx.RequireEqual(out[infer] * known, numel,
                                     "reshape keeps the number of elements");
  if (!st.ok()) return st;
  return out;
}

// view/reshape/_unsafe_view(self, size).
absl::StatusOr<Shapes> View(const ShapeContext& ctx) {
  return One(InferSize(ctx, ctx.Dims(1), Numel(ctx.shape(0))));
}

// view_as/reshape_as(self, other).
absl::StatusOr<Shapes> ViewAs(const ShapeContext& ctx) {
  absl::Status st = ctx.RequireEqual(Numel(ctx.shape(1)), Numel(ctx.shape(0)),
                                     "reshape keeps the number of elements");
  if (!st.ok()) return st;
  return Shapes{ctx.shape(1)};
}

// _reshape_alias/as_strided(self, size, stride, ...): the sizes are given outright.
absl::StatusOr<Shapes> GivenSizes(const ShapeContext& ctx) {
  std::vector<int64_t> sizes = ctx.Ints(1);
  for (int64_t s : sizes) {
    if (s < 0) return ShapeError(ctx, "negative size ", s);
  }
  return Shapes{Shape(sizes.begin(), sizes.end())};
}

// flatten.using_ints(self, start_dim, end_dim). A 0-dim tensor flattens to [1].
absl::StatusOr<Shapes> Flatten(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  absl::StatusOr<int64_t> start = WrapDim(ctx.Int(1), in.size(), ctx.op());
  if (!start.ok()) return start.status();
  absl::StatusOr<int64_t> end = WrapDim(ctx.Int(2), in.size(), ctx.op());
  if (!end.ok()) return end.status();
  if (*start > *end) return ShapeError(ctx, "start_dim cannot come after end_dim");
  if (in.empty()) return Shapes{Shape{1}};
  Shape out(in.begin(), in.begin() + *start);
  Dim merged = 1;
  for (int64_t i = *start; i <= *end; ++i) merged = merged * in[i];
  out.push_back(merged);
  out.insert(out.end(), in.begin() + *end + 1, in.end());
  return Shapes{out};
}

// unflatten.int(self, dim, sizes): sizes (one may be -1) must multiply up to size(dim).
absl::StatusOr<Shapes> Unflatten(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  absl::StatusOr<int64_t> dim = WrapDim(ctx.Int(1), in.size(), ctx.op());
  if (!dim.ok()) return dim.status();
  const std::vector<Dim> sizes = ctx.Dims(2);
  if (sizes.empty()) return ShapeError(ctx, "sizes must be non-empty");
  if (in.empty()) return ShapeError(ctx, "cannot unflatten a 0-dim tensor");
  absl::StatusOr<Shape> inner = InferSize(ctx, sizes, in[*dim]);
  if (!inner.ok()) return inner.status();
  Shape out(in.begin(), in.begin() + *dim);
  out.insert(out.end(), inner->begin(), inner->end());
  out.insert(out.end(), in.begin() + *dim + 1, in.end());
  return Shapes{out};
}

// Wraps a list of dims, rejecting duplicates.
absl::StatusOr<std::vector<int64_t>> WrapUniqueDims(const ShapeContext& ctx,
                                                    const std::vector<int64_t>& dims,
                                                    int64_t rank) {
  std::vector<int64_t> out;
  std::vector<bool> seen(std::max<int64_t>(rank, 1), false);
  for (int64_t d : dims) {
    absl::StatusOr<int64_t> w = WrapDim(d, rank, ctx.op());
    if (!w.ok()) return w.status();
    if (seen[*w]) return ShapeError(ctx, "repeated dim ", *w);
    seen[*w] = true;
    out.push_back(*w);
  }
  return out;
}

// permute(self, dims): dims is a permutation of every dim.
absl::StatusOr<Shapes> Permute(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  const std::vector<int64_t> dims = ctx.Ints(1);
  if (dims.size() != in.size()) {
    return ShapeError(ctx, "number of dims don't match in permute: ", dims.size(), " vs rank ",
                      in.size());
  }
  absl::StatusOr<std::vector<int64_t>> wrapped = WrapUniqueDims(ctx, dims, in.size());
  if (!wrapped.ok()) return wrapped.status();
  Shape out;
  for (int64_t d : *wrapped) out.push_back(in[d]);
  return Shapes{out};
}

// transpose.int/swapaxes/swapdims(self, dim0, dim1).
absl::StatusOr<Shapes> Transpose(const ShapeContext& ctx) {
  Shape out = ctx.shape(0);
  absl::StatusOr<int64_t> d0 = WrapDim(ctx.Int(1), out.size(), ctx.op());
  if (!d0.ok()) return d0.status();
  absl::StatusOr<int64_t> d1 = WrapDim(ctx.Int(2), out.size(), ctx.op());
  if (!d1.ok()) return d1.status();
  if (!out.empty()) std::swap(out[*d0], out[*d1]);
  return Shapes{out};
}

// t(self): only for rank <= 2.
absl::StatusOr<Shapes> T(const ShapeContext& ctx) {
  Shape out = ctx.shape(0);
  if (out.size() > 2) {
    return ShapeError(ctx, "t() expects a tensor with <= 2 dimensions, got ", out.size());
  }
  if (out.size() == 2) std::swap(out[0], out[1]);
  return Shapes{out};
}

// movedim(self, source, destination): the moved dims land at their destinations, the others
// keep their order in the remaining slots.
absl::StatusOr<Shapes> Movedim(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  const int64_t rank = in.size();
  const std::vector<int64_t> src_in = ctx.Ints(1);
  const std::vector<int64_t> dst_in = ctx.Ints(2);
  if (src_in.size() != dst_in.size()) {
    return ShapeError(ctx, "source and destination must have the same number of dims");
  }
  absl::StatusOr<std::vector<int64_t>> src = WrapUniqueDims(ctx, src_in, rank);
  if (!src.ok()) return src.status();
  absl::StatusOr<std::vector<int64_t>> dst = WrapUniqueDims(ctx, dst_in, rank);
  if (!dst.ok()) return dst.status();
  if (rank == 0) return Shapes{in};
  std::vector<int64_t> order(rank, -1);
  std::vector<bool> moved(rank, false);
  for (size_t i = 0; i < src->size(); ++i) {
    order[(*dst)[i]] = (*src)[i];
    moved[(*src)[i]] = true;
  }
  int64_t next = 0;
  for (int64_t& o : order) {
    if (o >= 0) continue;
    while (moved[next]) ++next;
    o = next++;
  }
  Shape out;
  for (int64_t o : order) out.push_back(in[o]);
  return Shapes{out};
}

// unsqueeze(self, dim): dim ranges over rank + 1 positions.
absl::StatusOr<Shapes> Unsqueeze(const ShapeContext& ctx) {
  Shape out = ctx.shape(0);
  absl::StatusOr<int64_t> d = WrapDim(ctx.Int(1), out.size() + 1, ctx.op());
  if (!d.ok()) return d.status();
  out.insert(out.begin() + *d, 1);
  return Shapes{out};
}

// squeeze(self): drops every size-1 dim.
absl::StatusOr<Shapes> SqueezeAll(const ShapeContext& ctx) {
  Shape out;
  for (const Dim& d : ctx.shape(0)) {
    if (!SizeEquals(ctx, d, 1, "squeeze drops size-1 dims")) out.push_back(d);
  }
  return Shapes{out};
}

// squeeze.dim(self, dim): drops the dim if its size is 1, else a no-op.
absl::StatusOr<Shapes> SqueezeDim(const ShapeContext& ctx) {
  Shape out = ctx.shape(0);
  absl::StatusOr<int64_t> d = WrapDim(ctx.Int(1), out.size(), ctx.op());
  if (!d.ok()) return d.status();
  if (!out.empty() && SizeEquals(ctx, out[*d], 1, "squeeze drops size-1 dims")) {
    out.erase(out.begin() + *d);
  }
  return Shapes{out};
}

// expand(self, size): -1 keeps a size, size-1 dims stretch, new dims go in front (and may not
// be -1).
absl::StatusOr<Shape> ExpandShape(const ShapeContext& ctx, const Shape& in,
                                  const Shape& target) {
  if (target.size() < in.size()) {
    return ShapeError(ctx, "the number of sizes provided (", target.size(),
                      ") must be greater or equal to the number of dimensions in the tensor (",
                      in.size(), ")");
  }
  const size_t lead = target.size() - in.size();
  Shape out(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    const bool existing = i >= lead;
    const Dim t = target[i];
    if (!existing) {
      if (t == -1) {
        return ShapeError(ctx, "the expanded size -1 isn't allowed in a leading, non-existing "
                          "dimension ", i);
      }
      if (ConstantBelow(t, 0)) return ShapeError(ctx, "invalid expanded size ", t);
      out[i] = t;
      continue;
    }
    const Dim s = in[i - lead];
    if (t == -1) {
      out[i] = s;
    } else if (SizeEquals(ctx, s, 1, "expand stretches size-1 dims")) {
      if (ConstantBelow(t, 0)) return ShapeError(ctx, "invalid expanded size ", t);
      out[i] = t;
    } else {
      absl::Status st = ctx.RequireEqual(s, t, "expand of a non-singleton dim");
      if (!st.ok()) return st;
      out[i] = s;
    }
  }
  return out;
}

absl::StatusOr<Shapes> Expand(const ShapeContext& ctx) {
  return One(ExpandShape(ctx, ctx.shape(0), ctx.Dims(1)));
}

absl::StatusOr<Shapes> ExpandAs(const ShapeContext& ctx) {
  return One(ExpandShape(ctx, ctx.shape(0), ctx.shape(1)));
}

absl::StatusOr<int64_t> WrapDimOfNonScalar(const ShapeContext& ctx, int64_t dim,
                                           const Shape& in, const char* what) {
  if (in.empty()) return ShapeError(ctx, what, " cannot be applied to a 0-dim tensor");
  return WrapDim(dim, in.size(), ctx.op());
}

// The length of [start, end) within a dim of `size` after ATen's clamping: negative bounds count
// from the end, then both clamp into [0, size] and end clamps to at least start.
Dim SliceLength(const ShapeContext& ctx, Dim size, int64_t start_arg, int64_t end_arg) {
  Dim start = start_arg;
  Dim end = end_arg;
  if (start_arg < 0) start = start + size;
  if (end_arg < 0) end = end + size;
  if (SizeLess(ctx, start, 0, "slice start clamps to 0")) {
    start = 0;
  } else if (!SizeLess(ctx, start, size, "slice start clamps to the size")) {
    start = size;
  }
  if (SizeLess(ctx, end, start, "slice end clamps to the start")) {
    end = start;
  } else if (!SizeLess(ctx, end, size, "slice end clamps to the size")) {
    end = size;
  }
  return end - start;
}

// slice.Tensor(self, dim, start?, end?, step): bounds clamp into [0, size] as ATen does.
absl::StatusOr<Shapes> Slice(const ShapeContext& ctx) {
  Shape out = ctx.shape(0);
  absl::StatusOr<int64_t> dim = WrapDimOfNonScalar(ctx, ctx.Int(1), out, "slice()");
  if (!dim.ok()) return dim.status();
  const int64_t step = ctx.Int(4);
  if (step <= 0) return ShapeError(ctx, "slice step must be positive");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  // 1.13 takes INT64_MAX literally (later releases read it as "no start").
  const int64_t start_arg = ctx.is_none(2) ? 0 : ctx.Int(2);
  const int64_t end_arg = ctx.is_none(3) ? kMax : ctx.Int(3);
  const Dim len = SliceLength(ctx, out[*dim], start_arg, end_arg);
  out[*dim] = DivFloor(ctx, len + step - 1, step, "slice with a step");
  return Shapes{out};
}

// select.int(self, dim, index): drops the dim; index must lie in [-size, size).
absl::StatusOr<Shapes> Select(const ShapeContext& ctx) {
  Shape out = ctx.shape(0);
  absl::StatusOr<int64_t> dim = WrapDimOfNonScalar(ctx, ctx.Int(1), out, "select()");
  if (!dim.ok()) return dim.status();
  const int64_t index = ctx.Int(2);
  const Dim size = out[*dim];
  if (SizeLess(ctx, index + size, 0, "select index in range") ||
      !SizeLess(ctx, index, size, "select index in range")) {
    return ShapeError(ctx, "index ", index, " out of range for tensor of size ", size,
                      " at dimension ", *dim);
  }
  out.erase(out.begin() + *dim);
  return Shapes{out};
}

// narrow(self, dim, start, length): the dim becomes `length`; start (possibly negative, or equal
// to the size) plus length must stay within the dim.
absl::StatusOr<Shapes> Narrow(const ShapeContext& ctx) {
  Shape out = ctx.shape(0);
  absl::StatusOr<int64_t> dim = WrapDimOfNonScalar(ctx, ctx.Int(1), out, "narrow()");
  if (!dim.ok()) return dim.status();
  const Dim size = out[*dim];
  const int64_t length = ctx.Int(3);
  if (length < 0) return ShapeError(ctx, "length must be non-negative, got ", length);
  if (ctx.is_tensor(2)) {
    // narrow.Tensor: the start is a 0-dim tensor whose value the rule cannot see; its bounds
    // are checked by the kernel.
    if (!ctx.shape(2).empty()) return ShapeError(ctx, "start must be a 0-dim tensor");
    out[*dim] = length;
    return Shapes{out};
  }
  Dim start = ctx.Int(2);
  if (!SizeEquals(ctx, start, size, "narrow start at the end")) {
    if (SizeLess(ctx, start + size, 0, "narrow start in range") ||
        !SizeLess(ctx, start, size, "narrow start in range")) {
      return ShapeError(ctx, "start ", ctx.Int(2), " out of range for dimension of size ", size);
    }
    if (ctx.Int(2) < 0) start = start + size;
  }
  if (SizeLess(ctx, size - length, start, "narrow within the dim")) {
    return ShapeError(ctx, "start (", start, ") + length (", length,
                      ") exceeds dimension size (", size, ")");
  }
  out[*dim] = length;
  return Shapes{out};
}

Dim MinSize(const ShapeContext& ctx, Dim a, Dim b, absl::string_view why) {
  return SizeLess(ctx, b, a, why) ? b : a;
}

// diagonal(self, offset, dim1, dim2): both dims are removed and the diagonal's length appended.
absl::StatusOr<Shapes> Diagonal(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  const int64_t offset = ctx.Int(1);
  absl::StatusOr<int64_t> d1 = WrapDim(ctx.Int(2), in.size(), ctx.op());
  if (!d1.ok()) return d1.status();
  absl::StatusOr<int64_t> d2 = WrapDim(ctx.Int(3), in.size(), ctx.op());
  if (!d2.ok()) return d2.status();
  if (*d1 == *d2) return ShapeError(ctx, "diagonal dimensions cannot be identical");
  if (in.size() < 2) return ShapeError(ctx, "diagonal needs at least 2 dims");
  Dim len = offset >= 0 ? MinSize(ctx, in[*d1], in[*d2] - offset, "diagonal length")
                        : MinSize(ctx, in[*d1] + offset, in[*d2], "diagonal length");
  if (SizeLess(ctx, len, 0, "diagonal length is at least 0")) len = 0;
  Shape out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (static_cast<int64_t>(i) != *d1 && static_cast<int64_t>(i) != *d2) out.push_back(in[i]);
  }
  out.push_back(len);
  return Shapes{out};
}

}  // namespace

WARDEN_REGISTER_OPS(view) {
  auto add = [&r](std::initializer_list<const char*> names, const ShapeRule& rule) {
    for (const char* name : names) r.Add({name, rule});
  };
  // Note: a view that ATen cannot express with the input's strides (view of a transposed
  // tensor) fails in the kernel; the rules know only sizes, so view and reshape share one rule.
  add({"aten::view", "aten::reshape", "aten::_unsafe_view", "aten::view_copy"}, View);
  add({"aten::view_as", "aten::reshape_as"}, ViewAs);
  add({"aten::_reshape_alias", "aten::as_strided"}, GivenSizes);
  r.Add({"aten::flatten.using_ints", Flatten});
  r.Add({"aten::unflatten.int", Unflatten});
  r.Add({"aten::permute", Permute});
  add({"aten::transpose.int", "aten::transpose_", "aten::swapaxes", "aten::swapdims"},
      Transpose);
  add({"aten::t", "aten::t_"}, T);
  add({"aten::movedim.int", "aten::movedim.intlist"}, Movedim);
  add({"aten::unsqueeze", "aten::unsqueeze_"}, Unsqueeze);
  add({"aten::squeeze", "aten::squeeze_"}, SqueezeAll);
  add({"aten::squeeze.dim", "aten::squeeze_.dim"}, SqueezeDim);
  add({"aten::expand", "aten::expand_copy"}, Expand);
  r.Add({"aten::expand_as", ExpandAs});
  r.Add({"aten::slice.Tensor", Slice});
  r.Add({"aten::select.int", Select});
  add({"aten::narrow", "aten::narrow.Tensor"}, Narrow);
  r.Add({"aten::diagonal", Diagonal});
}

}  // namespace warden::ops
