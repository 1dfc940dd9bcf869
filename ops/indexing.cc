// Shape rules of ops that pick or place elements by index (index_select, gather, scatter,
// embedding) and of the rearranging copies repeat, flip, roll, tril/triu. aten::index.Tensor has
// no rule: see the Note below.

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "ops/registry.h"

namespace warden::ops {
namespace {

using Shapes = std::vector<Shape>;

// index_select(self, dim, index): index is at most 1-D; the dim becomes its length. A 0-dim self
// stays 0-dim (and needs a one-element index).
absl::StatusOr<Shapes> IndexSelect(const ShapeContext& ctx) {
  Shape out = ctx.shape(0);
  const Shape& index = ctx.shape(2);
  absl::StatusOr<int64_t> dim = WrapDim(ctx.Int(1), out.size(), ctx.op());
  if (!dim.ok()) return dim.status();
  if (index.size() > 1) return ShapeError(ctx, "index is supposed to be a vector");
  const Dim numel = Numel(index);
  if (out.empty()) {
    absl::Status st = ctx.RequireEqual(numel, 1, "index into a 0-dim tensor has one value");
    if (!st.ok()) return st;
    return Shapes{out};
  }
  out[*dim] = numel;
  return Shapes{out};
}

// gather(self, dim, index): the result has the index's shape; index and self have the same rank
// (0-D counts as 1-D) and the index is no larger than self outside `dim`.
absl::StatusOr<Shapes> Gather(const ShapeContext& ctx) {
  const Shape& self = ctx.shape(0);
  const Shape& index = ctx.shape(2);
  absl::StatusOr<int64_t> dim = WrapDim(ctx.Int(1), self.size(), ctx.op());
  if (!dim.ok()) return dim.status();
  if (std::max<size_t>(self.size(), 1) != std::max<size_t>(index.size(), 1)) {
    return ShapeError(ctx, "index tensor must have the same number of dimensions as input tensor");
  }
  for (size_t d = 0; d < self.size() && d < index.size(); ++d) {
    if (static_cast<int64_t>(d) == *dim) continue;
    if (SizeLess(ctx, self[d], index[d], "gather index no larger than self")) {
      return ShapeError(ctx, "size does not match at dimension ", d, " expected index ",
                        index[d], " to be smaller than self ", self[d]);
    }
  }
  return Shapes{index};
}

// embedding(weight [num, dim], indices): indices' shape plus the embedding dim.
absl::StatusOr<Shapes> Embedding(const ShapeContext& ctx) {
  const Shape& weight = ctx.shape(0);
  if (weight.size() != 2) return ShapeError(ctx, "'weight' must be 2-D, got rank ", weight.size());
  Shape out = ctx.shape(1);
  out.push_back(weight[1]);
  return Shapes{out};
}

// repeat(self, repeats): repeats may add leading dims, never drop any.
absl::StatusOr<Shapes> Repeat(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  const std::vector<int64_t> repeats = ctx.Ints(1);
  if (repeats.size() < in.size()) {
    return ShapeError(ctx, "number of dimensions of repeat dims (", repeats.size(),
                      ") can not be smaller than number of dimensions of tensor (", in.size(), ")");
  }
  const size_t lead = repeats.size() - in.size();
  Shape out;
  for (size_t i = 0; i < repeats.size(); ++i) {
    if (repeats[i] < 0) return ShapeError(ctx, "negative repeat ", repeats[i]);
    out.push_back(i < lead ? Dim(repeats[i]) : in[i - lead] * repeats[i]);
  }
  return Shapes{out};
}

// flip(self, dims): distinct, valid dims; the shape is kept.
absl::StatusOr<Shapes> Flip(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  std::vector<bool> seen(std::max<size_t>(in.size(), 1), false);
  for (int64_t d : ctx.Ints(1)) {
    absl::StatusOr<int64_t> w = WrapDim(d, in.size(), ctx.op());
    if (!w.ok()) return w.status();
    if (seen[*w]) return ShapeError(ctx, "dim ", *w, " appears multiple times in the list of dims");
    seen[*w] = true;
  }
  return Shapes{in};
}

// roll(self, shifts, dims): one shift per dim, or a single shift with no dims (roll the
// flattened tensor). The shape is kept.
absl::StatusOr<Shapes> Roll(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  const std::vector<int64_t> shifts = ctx.Ints(1);
  const std::vector<int64_t> dims = ctx.Ints(2);
  if (shifts.empty()) return ShapeError(ctx, "`shifts` required");
  if (dims.empty() && shifts.size() == 1) return Shapes{in};
  if (shifts.size() != dims.size()) {
    return ShapeError(ctx, "shifts and dimensions must align. shifts: ", shifts.size(),
                      ", dims: ", dims.size());
  }
  for (int64_t d : dims) {
    absl::StatusOr<int64_t> w = WrapDim(d, in.size(), ctx.op());
    if (!w.ok()) return w.status();
  }
  return Shapes{in};
}

// tril/triu(self, diagonal): a batch of matrices; the shape is kept.
absl::StatusOr<Shapes> Triangle(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  if (in.size() < 2) return ShapeError(ctx, "input tensor must have at least 2 dimensions");
  return Shapes{in};
}

// scatter(self, dim, index, src-or-value, ...) writes into (a copy of) self: self's shape. The
// dim is checked; index and src sizes are bounded by the kernel, not by shape.
absl::StatusOr<Shapes> Scatter(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  absl::StatusOr<int64_t> dim = WrapDim(ctx.Int(1), in.size(), ctx.op());
  if (!dim.ok()) return dim.status();
  return Shapes{in};
}

}  // namespace

// Note [No rule for index.Tensor]
// Advanced indexing's result shape depends on the index tensors' dtypes: a bool or uint8 index
// is a mask (a data-dependent number of elements, like nonzero), a long index is gathered. Shape
// contexts carry shapes only, so a rule could not tell them apart. The tracer records index.Tensor
// as opaque (it runs eagerly and takes the real shape), or decomposes it.
WARDEN_REGISTER_OPS(indexing) {
  auto add = [&r](std::initializer_list<const char*> names, const ShapeRule& rule) {
    for (const char* name : names) r.Add({name, rule});
  };
  r.Add({"aten::index_select", IndexSelect});
  r.Add({"aten::gather", Gather});
  r.Add({"aten::embedding", Embedding});
  // embedding_renorm_(weight, indices, max_norm, norm_type): nn::Embedding's max_norm rescales the
  // looked-up rows of the weight in place; the result is the weight.
  r.Add({"aten::embedding_renorm_", SameAs(0)});
  r.Add({"aten::repeat", Repeat});
  r.Add({"aten::flip", Flip});
  r.Add({"aten::roll", Roll});
  add({"aten::tril", "aten::tril_", "aten::triu", "aten::triu_"}, Triangle);
  add({"aten::scatter.src", "aten::scatter.value", "aten::scatter.reduce",
       "aten::scatter.value_reduce", "aten::scatter_.src", "aten::scatter_.value",
       "aten::scatter_.reduce", "aten::scatter_.value_reduce", "aten::scatter_add",
       "aten::scatter_add_", "aten::index_add", "aten::index_copy", "aten::index_fill.int_Scalar",
       "aten::index_fill.int_Tensor"},
      Scatter);
}

}  // namespace warden::ops
