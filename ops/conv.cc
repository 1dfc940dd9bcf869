// Shape rules of convolutions (conv1d/2d/3d, transposed, aten::convolution and _convolution) and
// pooling (max/avg, adaptive). The batch dim passes through untouched, so a dynamic batch stays
// symbolic; a spatial size becomes an expression with floor division, exact when the stride is 1
// (or divides it), otherwise DivFloor specializes it with the op as the reason.

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "ops/registry.h"

namespace warden::ops {
namespace {

using Shapes = std::vector<Shape>;

// An int[] argument expanded to `n` spatial dims (a single value repeats, as ATen's expand_param
// does); an empty list gives `fallback`.
absl::StatusOr<std::vector<int64_t>> Expand(const ShapeContext& ctx, size_t i, size_t n, const char* what,
                                            const std::vector<int64_t>& fallback) {
  std::vector<int64_t> v = ctx.Ints(i);
  if (v.empty()) v = fallback;
  if (v.size() == 1 && n > 1) v.assign(n, v[0]);
  if (v.size() != n) {
    return ShapeError(ctx, "expected ", what, " to have ", n, " elements, got ", v.size());
  }
  return v;
}

// floor((in + 2p - d(k-1) - 1) / s) + 1: the output size of a convolution or pooling window
// without ceil mode.
Dim WindowOut(const ShapeContext& ctx, const Dim& in, const Dim& k, int64_t s, int64_t p, int64_t d) {
  const Dim span = in + 2 * p - Dim(d) * (k - 1) - 1;
  if (span.is_constant() && span.constant() < 0) {  // rounds toward -inf, as ATen's div_rtn
    return Dim((span.constant() - (s - 1)) / s + 1);
  }
  return DivFloor(ctx, span, s, "convolution/pooling output size with a stride that does not divide it") + 1;
}

// convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
// and the frontends that take the same tensors. `layout` gives the argument positions.
struct ConvArgs {
  size_t stride, padding, dilation, output_padding, groups;  // SIZE_MAX: absent
  bool transposed = false;
  size_t transposed_flag = SIZE_MAX;  // aten::convolution: read the flag
};

absl::StatusOr<Shapes> Conv(const ShapeContext& ctx, const ConvArgs& a) {
  const Shape& input = ctx.shape(0);
  const Shape& weight = ctx.shape(1);
  if (!ctx.is_tensor(0) || !ctx.is_tensor(1)) return ShapeError(ctx, "input and weight must be tensors");
  if (weight.size() < 3) return ShapeError(ctx, "weight must have at least 3 dims, got ", weight.size());
  const size_t spatial = weight.size() - 2;
  const bool batched = input.size() == weight.size();
  if (!batched && input.size() + 1 != weight.size()) {
    return ShapeError(ctx, "expected a ", weight.size() - 1, "-D (unbatched) or ", weight.size(),
                      "-D (batched) input for a ", weight.size(), "-D weight, got ", input.size(), "-D");
  }
  const bool transposed = a.transposed_flag != SIZE_MAX ? ctx.Bool(a.transposed_flag) : a.transposed;
  const int64_t groups = a.groups != SIZE_MAX ? ctx.Int(a.groups) : 1;
  if (groups <= 0) return ShapeError(ctx, "non-positive groups is not supported");
  auto stride = Expand(ctx, a.stride, spatial, "stride", {1});
  if (!stride.ok()) return stride.status();
  auto padding = Expand(ctx, a.padding, spatial, "padding", {0});
  if (!padding.ok()) return padding.status();
  auto dilation = Expand(ctx, a.dilation, spatial, "dilation", {1});
  if (!dilation.ok()) return dilation.status();
  std::vector<int64_t> output_padding(spatial, 0);
  if (transposed && a.output_padding != SIZE_MAX) {
    auto op = Expand(ctx, a.output_padding, spatial, "output_padding", {0});
    if (!op.ok()) return op.status();
    output_padding = *op;
  }
  for (size_t i = 0; i < spatial; ++i) {
    if ((*stride)[i] <= 0) return ShapeError(ctx, "non-positive stride is not supported");
    if ((*padding)[i] < 0) return ShapeError(ctx, "negative padding is not supported");
    if ((*dilation)[i] <= 0) return ShapeError(ctx, "dilation should be greater than zero");
  }
  const size_t c_axis = batched ? 1 : 0;
  Shape out;
  if (batched) out.push_back(input[0]);
  absl::Status st;
  if (transposed) {
    // weight [C_in, C_out / groups, k...]
    st = ctx.RequireEqual(input[c_axis], weight[0], "input channels equal weight.size(0)");
    out.push_back(weight[1] * groups);
  } else {
    // weight [C_out, C_in / groups, k...]
    st = ctx.RequireEqual(input[c_axis], weight[1] * groups, "input channels equal weight.size(1) * groups");
    out.push_back(weight[0]);
  }
  if (!st.ok()) return st;
  if (ctx.is_tensor(2)) {
    const Shape& bias = ctx.shape(2);
    if (bias.size() != 1) return ShapeError(ctx, "bias must be 1-D, got rank ", bias.size());
    st = ctx.RequireEqual(bias[0], out[batched ? 1 : 0], "bias has one element per output channel");
    if (!st.ok()) return st;
  }
  for (size_t i = 0; i < spatial; ++i) {
    const Dim& in = input[c_axis + 1 + i];
    const Dim& k = weight[2 + i];
    const int64_t s = (*stride)[i], p = (*padding)[i], d = (*dilation)[i];
    Dim o;
    if (transposed) {
      o = (in - 1) * s - 2 * p + Dim(d) * (k - 1) + output_padding[i] + 1;
    } else {
      // ATen rejects a kernel (with dilation) larger than the padded input.
      if (SizeLess(ctx, in + 2 * p, Dim(d) * (k - 1) + 1, "kernel size can't be greater than the padded input")) {
        return ShapeError(ctx, "kernel size can't be greater than actual input size");
      }
      o = WindowOut(ctx, in, k, s, p, d);
    }
    out.push_back(o);
  }
  return Shapes{out};
}

ShapeRule ConvRule(ConvArgs a) {
  return [a](const ShapeContext& ctx) { return Conv(ctx, a); };
}

// Pooling windows: kernel_size, stride (empty: the kernel), padding, dilation, ceil_mode.
struct PoolArgs {
  size_t spatial;
  size_t kernel = 1, stride = 2, padding = 3, dilation = SIZE_MAX, ceil_mode;
  int outputs = 1;  // 2: (values, indices)
};

absl::StatusOr<Shapes> Pool(const ShapeContext& ctx, const PoolArgs& a) {
  const Shape& input = ctx.shape(0);
  const size_t n = a.spatial;
  if (input.size() != n + 1 && input.size() != n + 2) {
    return ShapeError(ctx, "expected ", n + 1, "-D or ", n + 2, "-D input, got ", input.size(), "-D");
  }
  auto kernel = Expand(ctx, a.kernel, n, "kernel_size", {});
  if (!kernel.ok()) return kernel.status();
  auto stride = Expand(ctx, a.stride, n, "stride", *kernel);
  if (!stride.ok()) return stride.status();
  auto padding = Expand(ctx, a.padding, n, "padding", {0});
  if (!padding.ok()) return padding.status();
  std::vector<int64_t> dilation(n, 1);
  if (a.dilation != SIZE_MAX) {
    auto d = Expand(ctx, a.dilation, n, "dilation", {1});
    if (!d.ok()) return d.status();
    dilation = *d;
  }
  const bool ceil_mode = ctx.Bool(a.ceil_mode);
  Shape out(input.begin(), input.end() - n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = (*kernel)[i], s = (*stride)[i], p = (*padding)[i], d = dilation[i];
    if (k <= 0 || s <= 0 || d <= 0) return ShapeError(ctx, "kernel_size, stride and dilation must be positive");
    if (p < 0 || p > ((k - 1) * d + 1) / 2) return ShapeError(ctx, "pad should be at most half of effective kernel size");
    const Dim& in = input[input.size() - n + i];
    Dim o;
    if (!ceil_mode) {
      o = WindowOut(ctx, in, k, s, p, d);
    } else {
      // Ceil mode rounds up and then drops a last window that would start in the padding: a
      // branch on the value, so the size is specialized.
      const int64_t v = SpecializeSize(ctx, in, "pooling with ceil_mode");
      int64_t q = (v + 2 * p - d * (k - 1) - 1 + (s - 1)) / s + 1;
      if ((q - 1) * s >= v + p) --q;
      o = q;
    }
    if (SizeLess(ctx, o, 1, "pooling output size is at least 1")) {
      return ShapeError(ctx, "output size is too small");
    }
    out.push_back(o);
  }
  Shapes result{out};
  if (a.outputs == 2) result.push_back(out);
  return result;
}

ShapeRule PoolRule(PoolArgs a) {
  return [a](const ShapeContext& ctx) { return Pool(ctx, a); };
}

// adaptive_{avg,max}_poolNd(self, output_size): the leading dims, then output_size (constants).
ShapeRule AdaptiveRule(size_t n, int outputs) {
  return [n, outputs](const ShapeContext& ctx) -> absl::StatusOr<Shapes> {
    const Shape& input = ctx.shape(0);
    if (input.size() != n + 1 && input.size() != n + 2) {
      return ShapeError(ctx, "expected ", n + 1, "-D or ", n + 2, "-D input, got ", input.size(), "-D");
    }
    // Exactly one size per pooled dim (ATen does not expand a single value here).
    const std::vector<int64_t> size = ctx.Ints(1);
    if (size.size() != n) return ShapeError(ctx, "output_size must have ", n, " elements, got ", size.size());
    Shape out(input.begin(), input.end() - n);
    for (size_t i = 0; i < n; ++i) {
      if (size[i] < 0) return ShapeError(ctx, "output_size must be non-negative");
      // Every non-batch dim must be non-empty (ATen checks it).
      if (SizeEquals(ctx, input[input.size() - n + i], 0, "adaptive pooling of an empty dim")) {
        return ShapeError(ctx, "expected input to have non-zero size for non-batch dimensions");
      }
      out.push_back(size[i]);
    }
    Shapes result{out};
    if (outputs == 2) result.push_back(out);
    return result;
  };
}

}  // namespace

WARDEN_REGISTER_OPS(conv) {
  constexpr size_t kNo = SIZE_MAX;
  // convN(input, weight, bias?, stride, padding, dilation, groups)
  for (const char* op : {"aten::conv1d", "aten::conv2d", "aten::conv3d"}) {
    r.Add({op, ConvRule({3, 4, 5, kNo, 6})});
  }
  // conv_transposeN(input, weight, bias?, stride, padding, output_padding, groups, dilation)
  for (const char* op : {"aten::conv_transpose1d", "aten::conv_transpose2d.input", "aten::conv_transpose3d.input"}) {
    r.Add({op, ConvRule({3, 4, 7, 5, 6, /*transposed=*/true})});
  }
  // convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
  for (const char* op : {"aten::convolution", "aten::_convolution"}) {
    r.Add({op, ConvRule({3, 4, 5, 7, 8, false, /*transposed_flag=*/6})});
  }
  // max_poolNd(self, kernel_size, stride, padding, dilation, ceil_mode)
  r.Add({"aten::max_pool1d", PoolRule({1, 1, 2, 3, 4, 5})});
  r.Add({"aten::max_pool2d", PoolRule({2, 1, 2, 3, 4, 5})});
  r.Add({"aten::max_pool3d", PoolRule({3, 1, 2, 3, 4, 5})});
  r.Add({"aten::max_pool1d_with_indices", PoolRule({1, 1, 2, 3, 4, 5, 2})});
  r.Add({"aten::max_pool2d_with_indices", PoolRule({2, 1, 2, 3, 4, 5, 2})});
  r.Add({"aten::max_pool3d_with_indices", PoolRule({3, 1, 2, 3, 4, 5, 2})});
  // avg_poolNd(self, kernel_size, stride, padding, ceil_mode, count_include_pad[, divisor_override])
  r.Add({"aten::avg_pool1d", PoolRule({1, 1, 2, 3, kNo, 4})});
  r.Add({"aten::avg_pool2d", PoolRule({2, 1, 2, 3, kNo, 4})});
  r.Add({"aten::avg_pool3d", PoolRule({3, 1, 2, 3, kNo, 4})});
  r.Add({"aten::adaptive_avg_pool1d", AdaptiveRule(1, 1)});
  r.Add({"aten::adaptive_avg_pool2d", AdaptiveRule(2, 1)});
  r.Add({"aten::adaptive_avg_pool3d", AdaptiveRule(3, 1)});
  r.Add({"aten::_adaptive_avg_pool2d", AdaptiveRule(2, 1)});
  r.Add({"aten::_adaptive_avg_pool3d", AdaptiveRule(3, 1)});
  r.Add({"aten::adaptive_max_pool1d", AdaptiveRule(1, 2)});
  r.Add({"aten::adaptive_max_pool2d", AdaptiveRule(2, 2)});
  r.Add({"aten::adaptive_max_pool3d", AdaptiveRule(3, 2)});
}

}  // namespace warden::ops
