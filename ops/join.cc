// Shape rules of ops that join tensors (cat, stack) or split one into a list (split, chunk,
// unbind). Splits return Tensor[], so their rules return one shape per element, and the number of
// elements depends on a size: those sizes are specialized (Note [Size predicates]).

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "ops/registry.h"

namespace warden::ops {
namespace {

using Shapes = std::vector<Shape>;

// cat(tensors, dim). As in ATen, 1-D tensors with zero elements are skipped (the legacy way to
// start a concatenation from `torch.tensor([])`), and the dim wraps against the first tensor that
// is not skipped. If every tensor is skipped, the result is one such empty tensor.
absl::StatusOr<Shapes> Cat(const ShapeContext& ctx) {
  const std::vector<Shape>& in = ctx.shapes(0);
  if (in.empty()) return ShapeError(ctx, "expected a non-empty list of Tensors");
  auto skipped = [&ctx](const Shape& s) {
    return s.size() == 1 && SizeEquals(ctx, s[0], 0, "cat skips legacy empty tensors");
  };
  const auto first = std::find_if_not(in.begin(), in.end(), skipped);
  if (first == in.end()) return Shapes{Shape{0}};
  const Shape& ref = *first;
  absl::StatusOr<int64_t> dim = WrapDim(ctx.Int(1), ref.size(), ctx.op());
  if (!dim.ok()) return dim.status();
  if (ref.empty()) return ShapeError(ctx, "zero-dimensional tensors cannot be concatenated");
  Shape out = ref;
  out[*dim] = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const Shape& s = in[i];
    if (skipped(s)) continue;
    if (s.size() != ref.size()) {
      return ShapeError(ctx, "Tensors must have same number of dimensions: got ", ref.size(),
                        " and ", s.size());
    }
    for (size_t d = 0; d < s.size(); ++d) {
      if (static_cast<int64_t>(d) == *dim) continue;
      absl::Status st = ctx.RequireEqual(s[d], ref[d], "cat sizes outside the cat dim");
      if (!st.ok()) return st;
    }
    out[*dim] = out[*dim] + s[*dim];
  }
  return Shapes{out};
}

// stack(tensors, dim): equal shapes, a new dim of length N at `dim` (which ranges over rank + 1).
absl::StatusOr<Shapes> Stack(const ShapeContext& ctx) {
  const std::vector<Shape>& in = ctx.shapes(0);
  if (in.empty()) return ShapeError(ctx, "stack expects a non-empty TensorList");
  absl::StatusOr<int64_t> dim = WrapDim(ctx.Int(1), in[0].size() + 1, ctx.op());
  if (!dim.ok()) return dim.status();
  for (size_t i = 1; i < in.size(); ++i) {
    absl::Status st =
        RequireSameShape(ctx, in[i], in[0], "stack expects each tensor to be equal size");
    if (!st.ok()) return st;
  }
  Shape out = in[0];
  out.insert(out.begin() + *dim, static_cast<Dim>(in.size()));
  return Shapes{out};
}

// The dim every split-like op works on; splitting a 0-dim tensor is an error.
absl::StatusOr<int64_t> SplitDim(const ShapeContext& ctx, const Shape& in, int64_t dim) {
  if (in.empty()) return ShapeError(ctx, "expects at least a 1-dimensional tensor");
  return WrapDim(dim, in.size(), ctx.op());
}

// `in` cut along `dim` into pieces of the given lengths.
Shapes Pieces(const Shape& in, int64_t dim, const std::vector<Dim>& lengths) {
  Shapes out;
  for (const Dim& len : lengths) {
    Shape s = in;
    s[dim] = len;
    out.push_back(s);
  }
  return out;
}

// split.Tensor(self, split_size, dim): pieces of split_size, the last one shorter; at least one
// piece (split_size 0 is allowed only for an empty dim).
absl::StatusOr<Shapes> SplitBySize(const ShapeContext& ctx, const Shape& in, int64_t dim,
                                   int64_t split_size) {
  if (split_size < 0) return ShapeError(ctx, "split_size must be non-negative, got ", split_size);
  const int64_t size = SpecializeSize(ctx, in[dim], "number of split outputs");
  if (split_size == 0 && size != 0) {
    return ShapeError(ctx, "split_size can only be 0 if dimension size is 0, but got ", size);
  }
  const int64_t n =
      split_size == 0 ? 1 : std::max<int64_t>((size + split_size - 1) / split_size, 1);
  std::vector<Dim> lengths(n, split_size);
  lengths.back() = split_size - (split_size * n - size);
  return Pieces(in, dim, lengths);
}

absl::StatusOr<Shapes> Split(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  absl::StatusOr<int64_t> dim = SplitDim(ctx, in, ctx.Int(2));
  if (!dim.ok()) return dim.status();
  return SplitBySize(ctx, in, *dim, ctx.Int(1));
}

// split_with_sizes(self, split_sizes, dim): the sizes must add up to the dim.
absl::StatusOr<Shapes> SplitWithSizes(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  absl::StatusOr<int64_t> dim = SplitDim(ctx, in, ctx.Int(2));
  if (!dim.ok()) return dim.status();
  const std::vector<int64_t> sizes = ctx.Ints(1);
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) return ShapeError(ctx, "split sizes must be non-negative, got ", s);
    total += s;
  }
  absl::Status st = ctx.RequireEqual(total, in[*dim], "split_with_sizes sizes sum to the dim");
  if (!st.ok()) return st;
  return Pieces(in, *dim, std::vector<Dim>(sizes.begin(), sizes.end()));
}

// chunk(self, chunks, dim): split by ceil(size / chunks); an empty dim still gives `chunks`
// empty pieces.
absl::StatusOr<Shapes> Chunk(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  absl::StatusOr<int64_t> dim = SplitDim(ctx, in, ctx.Int(2));
  if (!dim.ok()) return dim.status();
  const int64_t chunks = ctx.Int(1);
  if (chunks <= 0) return ShapeError(ctx, "chunks must be greater than 0, got ", chunks);
  const int64_t size = SpecializeSize(ctx, in[*dim], "number of chunk outputs");
  const int64_t split_size = (size + chunks - 1) / chunks;
  if (split_size == 0 && size == 0) return Pieces(in, *dim, std::vector<Dim>(chunks, 0));
  return SplitBySize(ctx, in, *dim, split_size);
}

// unbind.int(self, dim): size(dim) tensors without that dim.
absl::StatusOr<Shapes> Unbind(const ShapeContext& ctx) {
  const Shape& in = ctx.shape(0);
  absl::StatusOr<int64_t> dim = SplitDim(ctx, in, ctx.Int(1));
  if (!dim.ok()) return dim.status();
  const int64_t n = SpecializeSize(ctx, in[*dim], "number of unbind outputs");
  Shape piece = in;
  piece.erase(piece.begin() + *dim);
  return Shapes(n, piece);
}

}  // namespace

WARDEN_REGISTER_OPS(join) {
  auto add = [&r](std::initializer_list<const char*> names, const ShapeRule& rule) {
    for (const char* name : names) r.Add({name, rule});
  };
  add({"aten::cat", "aten::concat"}, Cat);
  r.Add({"aten::stack", Stack});
  add({"aten::split.Tensor", "aten::unsafe_split.Tensor"}, Split);
  add({"aten::split.sizes", "aten::split_with_sizes", "aten::unsafe_split_with_sizes"},
      SplitWithSizes);
  add({"aten::chunk", "aten::unsafe_chunk"}, Chunk);
  r.Add({"aten::unbind.int", Unbind});
}

}  // namespace warden::ops
