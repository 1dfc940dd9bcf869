// Shape rules of matrix products: matmul in all its rank cases, mm/bmm/mv/dot/outer, the fused
// add-and-multiply forms (addmm, baddbmm, addmv, addr) and linear. Each requires the contracted
// sizes equal, which is the guard these ops contribute; batch dims broadcast only in matmul.

#include <algorithm>
#include <utility>

#include "ops/registry.h"

namespace warden::ops {
namespace {

using Shapes = std::vector<Shape>;

absl::Status RequireRank(const ShapeContext& ctx, const Shape& s, size_t rank, const char* what) {
  if (s.size() == rank) return absl::OkStatus();
  return ShapeError(ctx, what, " must be a ", rank, "-D tensor, got rank ", s.size());
}

// torch.matmul's shape semantics (ATen's matmul in LinearAlgebra.cpp): a 1-D left operand is a
// row vector and a 1-D right operand a column vector, both dropped from the result; everything
// left of the last two dims is a batch dim and broadcasts. ATen folds some cases into mm for
// speed, which changes nothing about the result shape.
absl::StatusOr<Shape> MatmulShape(const ShapeContext& ctx, const Shape& a, const Shape& b) {
  if (a.empty() || b.empty()) {
    return ShapeError(ctx, "both arguments to matmul need to be at least 1D, but they are ",
                      a.size(), "D and ", b.size(), "D");
  }
  // The contracted size: a's last dim against b's only dim (1-D) or second-to-last.
  const Dim a_inner = a.back();
  const Dim b_inner = b.size() == 1 ? b[0] : b[b.size() - 2];
  absl::Status st = ctx.RequireEqual(a_inner, b_inner, "matmul inner dims");
  if (!st.ok()) return st;
  if (a.size() == 1 && b.size() == 1) return Shape{};

  const Shape a_batch(a.begin(), a.end() - std::min<size_t>(a.size(), 2));
  const Shape b_batch(b.begin(), b.end() - std::min<size_t>(b.size(), 2));
  absl::StatusOr<Shape> out = Broadcast(ctx, a_batch, b_batch);
  if (!out.ok()) return out.status();
  if (a.size() > 1) out->push_back(a[a.size() - 2]);
  if (b.size() > 1) out->push_back(b.back());
  return out;
}

absl::StatusOr<Shapes> Matmul(const ShapeContext& ctx) {
  absl::StatusOr<Shape> out = MatmulShape(ctx, ctx.shape(0), ctx.shape(1));
  if (!out.ok()) return out.status();
  return Shapes{*out};
}

// [n, m] x [m, p] -> [n, p].
absl::StatusOr<Shape> MmShape(const ShapeContext& ctx, const Shape& a, const Shape& b) {
  absl::Status st = RequireRank(ctx, a, 2, "self");
  if (st.ok()) st = RequireRank(ctx, b, 2, "mat2");
  if (st.ok()) st = ctx.RequireEqual(a[1], b[0], "mm inner dims");
  if (!st.ok()) return st;
  return Shape{a[0], b[1]};
}

// [b, n, m] x [b, m, p] -> [b, n, p]; bmm does not broadcast the batch.
absl::StatusOr<Shape> BmmShape(const ShapeContext& ctx, const Shape& a, const Shape& b) {
  absl::Status st = RequireRank(ctx, a, 3, "batch1");
  if (st.ok()) st = RequireRank(ctx, b, 3, "batch2");
  if (st.ok()) st = ctx.RequireEqual(a[0], b[0], "bmm batch dims");
  if (st.ok()) st = ctx.RequireEqual(a[2], b[1], "bmm inner dims");
  if (!st.ok()) return st;
  return Shape{a[0], a[1], b[2]};
}

// [n, m] x [m] -> [n].
absl::StatusOr<Shape> MvShape(const ShapeContext& ctx, const Shape& a, const Shape& v) {
  absl::Status st = RequireRank(ctx, a, 2, "matrix");
  if (st.ok()) st = RequireRank(ctx, v, 1, "vector");
  if (st.ok()) st = ctx.RequireEqual(a[1], v[0], "mv inner dims");
  if (!st.ok()) return st;
  return Shape{a[0]};
}

// [n] x [m] -> [n, m].
absl::StatusOr<Shape> OuterShape(const ShapeContext& ctx, const Shape& a, const Shape& b) {
  absl::Status st = RequireRank(ctx, a, 1, "self");
  if (st.ok()) st = RequireRank(ctx, b, 1, "vec2");
  if (!st.ok()) return st;
  return Shape{a[0], b[0]};
}

using ProductShape = absl::StatusOr<Shape> (*)(const ShapeContext&, const Shape&, const Shape&);

// addmm(self, mat1, mat2) and friends: self broadcasts to the product's shape (the functional
// form) or must already have it (the in-place form, which writes the product into self).
ShapeRule AddProduct(ProductShape product, bool in_place) {
  return [=](const ShapeContext& ctx) -> absl::StatusOr<Shapes> {
    absl::StatusOr<Shape> out = product(ctx, ctx.shape(1), ctx.shape(2));
    if (!out.ok()) return out.status();
    absl::Status st = in_place ? RequireSameShape(ctx, ctx.shape(0), *out, "in-place output")
                               : RequireExpandable(ctx, ctx.shape(0), *out, "self broadcast");
    if (!st.ok()) return st;
    return Shapes{*out};
  };
}

ShapeRule Product(ProductShape product) {
  return [=](const ShapeContext& ctx) -> absl::StatusOr<Shapes> {
    absl::StatusOr<Shape> out = product(ctx, ctx.shape(0), ctx.shape(1));
    if (!out.ok()) return out.status();
    return Shapes{*out};
  };
}

// addbmm sums the batch away: [n, p].
absl::StatusOr<Shape> AddbmmProduct(const ShapeContext& ctx, const Shape& a, const Shape& b) {
  absl::StatusOr<Shape> out = BmmShape(ctx, a, b);
  if (!out.ok()) return out.status();
  return Shape{(*out)[1], (*out)[2]};
}

// linear(input, weight [out, in] or [in], bias?) is matmul(input, weight.t()) plus a bias that
// broadcasts into the product (ATen adds it in place or through addmm, neither grows the result).
absl::StatusOr<Shapes> Linear(const ShapeContext& ctx) {
  Shape w = ctx.shape(1);
  if (w.size() > 2) return ShapeError(ctx, "weight must be 1-D or 2-D, got rank ", w.size());
  if (w.size() == 2) std::swap(w[0], w[1]);
  absl::StatusOr<Shape> out = MatmulShape(ctx, ctx.shape(0), w);
  if (!out.ok()) return out.status();
  if (ctx.is_tensor(2)) {
    absl::Status st = RequireExpandable(ctx, ctx.shape(2), *out, "bias broadcast");
    if (!st.ok()) return st;
  }
  return Shapes{*out};
}

absl::StatusOr<Shapes> Dot(const ShapeContext& ctx) {
  absl::Status st = RequireRank(ctx, ctx.shape(0), 1, "self");
  if (st.ok()) st = RequireRank(ctx, ctx.shape(1), 1, "other");
  if (st.ok()) st = ctx.RequireEqual(ctx.shape(0)[0], ctx.shape(1)[0], "dot sizes");
  if (!st.ok()) return st;
  return Shapes{Shape{}};
}

}  // namespace

WARDEN_REGISTER_OPS(linalg) {
  r.Add({"aten::matmul", Matmul});
  r.Add({"aten::mm", Product(MmShape)});
  r.Add({"aten::bmm", Product(BmmShape)});
  r.Add({"aten::mv", Product(MvShape)});
  r.Add({"aten::outer", Product(OuterShape)});
  r.Add({"aten::ger", Product(OuterShape)});
  r.Add({"aten::dot", Dot});
  r.Add({"aten::vdot", Dot});
  r.Add({"aten::linear", Linear});
  r.Add({"aten::addmm", AddProduct(MmShape, /*in_place=*/false)});
  r.Add({"aten::addmm_", AddProduct(MmShape, /*in_place=*/true)});
  r.Add({"aten::baddbmm", AddProduct(BmmShape, /*in_place=*/false)});
  r.Add({"aten::baddbmm_", AddProduct(BmmShape, /*in_place=*/true)});
  r.Add({"aten::addbmm", AddProduct(AddbmmProduct, /*in_place=*/false)});
  r.Add({"aten::addmv", AddProduct(MvShape, /*in_place=*/false)});
  r.Add({"aten::addmv_", AddProduct(MvShape, /*in_place=*/true)});
  r.Add({"aten::addr", AddProduct(OuterShape, /*in_place=*/false)});
}

}  // namespace warden::ops
