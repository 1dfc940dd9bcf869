// Shape rules of normalization layers: layer_norm, group_norm, batch_norm, instance_norm and the
// native_* kernels that also return their statistics. The normalized output always has the
// input's shape; the rules check the parameters' sizes against it and shape the statistics.

#include <cstdint>

#include "ops/registry.h"

namespace warden::ops {
namespace {

using Shapes = std::vector<Shape>;

// layer_norm's checks (ATen's _check_layer_norm_inputs): weight and bias, when given, have
// exactly normalized_shape, and the input ends in it.
absl::Status CheckLayerNorm(const ShapeContext& ctx, const Shape& input,
                            const std::vector<int64_t>& normalized) {
  if (normalized.empty()) {
    return ShapeError(ctx, "expected normalized_shape to be at least 1-dimensional");
  }
  const Shape norm(normalized.begin(), normalized.end());
  for (size_t i : {size_t{2}, size_t{3}}) {
    if (!ctx.is_tensor(i)) continue;
    const char* why = i == 2 ? "weight has normalized_shape" : "bias has normalized_shape";
    absl::Status st = RequireSameShape(ctx, ctx.shape(i), norm, why);
    if (!st.ok()) return st;
  }
  if (input.size() < norm.size()) {
    return ShapeError(ctx, "input of rank ", input.size(), " is smaller than normalized_shape");
  }
  const size_t axis = input.size() - norm.size();
  for (size_t i = 0; i < norm.size(); ++i) {
    absl::Status st = ctx.RequireEqual(input[axis + i], norm[i], "input ends in normalized_shape");
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// layer_norm(input, normalized_shape, weight?, bias?, eps, cudnn_enable).
absl::StatusOr<Shapes> LayerNorm(const ShapeContext& ctx) {
  absl::Status st = CheckLayerNorm(ctx, ctx.shape(0), ctx.Ints(1));
  if (!st.ok()) return st;
  return Shapes{ctx.shape(0)};
}

// native_layer_norm(...) -> (out, mean, rstd): the statistics keep the leading (not normalized)
// dims and have size 1 in the normalized ones.
absl::StatusOr<Shapes> NativeLayerNorm(const ShapeContext& ctx) {
  const Shape& input = ctx.shape(0);
  const std::vector<int64_t> normalized = ctx.Ints(1);
  absl::Status st = CheckLayerNorm(ctx, input, normalized);
  if (!st.ok()) return st;
  const size_t axis = input.size() - normalized.size();
  Shape stat(input.begin(), input.begin() + axis);
  stat.resize(input.size(), 1);
  return Shapes{input, stat, stat};
}

// A 1-D parameter (weight, bias, running stats) of `channels` elements, when given.
absl::Status CheckChannels(const ShapeContext& ctx, size_t i, Dim channels, const char* what) {
  if (!ctx.is_tensor(i)) return absl::OkStatus();
  return ctx.RequireEqual(Numel(ctx.shape(i)), channels, what);
}

// group_norm(input, num_groups, weight?, bias?, eps, cudnn_enabled).
absl::StatusOr<Shapes> GroupNorm(const ShapeContext& ctx) {
  const Shape& input = ctx.shape(0);
  if (input.size() < 2) return ShapeError(ctx, "expected at least 2 dims, got ", input.size());
  const int64_t groups = ctx.Int(1);
  if (groups <= 0) return ShapeError(ctx, "num_groups must be positive, got ", groups);
  const Dim channels = input[1];
  absl::Status st = ctx.RequireEqual(DivFloor(ctx, channels, groups, "group size") * groups, channels,
                                     "channels divisible by num_groups");
  if (st.ok()) st = CheckChannels(ctx, 2, channels, "weight has one element per channel");
  if (st.ok()) st = CheckChannels(ctx, 3, channels, "bias has one element per channel");
  if (!st.ok()) return st;
  return Shapes{input};
}

// native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) -> (out, mean [N, group],
// rstd [N, group]).
absl::StatusOr<Shapes> NativeGroupNorm(const ShapeContext& ctx) {
  const Shape& input = ctx.shape(0);
  const Dim n = ctx.Int(3);
  const Dim c = ctx.Int(4);
  const Dim hxw = ctx.Int(5);
  const int64_t groups = ctx.Int(6);
  absl::Status st = ctx.RequireEqual(n * c * hxw, Numel(input), "N * C * HxW is the input size");
  if (st.ok()) st = CheckChannels(ctx, 1, c, "weight has one element per channel");
  if (st.ok()) st = CheckChannels(ctx, 2, c, "bias has one element per channel");
  if (!st.ok()) return st;
  return Shapes{input, Shape{n, groups}, Shape{n, groups}};
}

// batch_norm's checks (ATen's _batch_norm_impl_index): every given parameter has one element per
// channel (dim 1), and evaluation needs the running stats. An empty input skips the checks.
absl::Status CheckBatchNorm(const ShapeContext& ctx) {
  const Shape& input = ctx.shape(0);
  if (input.size() < 2) return ShapeError(ctx, "expected at least 2 dims, got ", input.size());
  // Empty iff some dim is 0: asked per dim, so that only a dim that could be 0 specializes.
  for (const Dim& d : input) {
    if (SizeEquals(ctx, d, 0, "batch_norm of an empty input")) return absl::OkStatus();
  }
  const bool training = ctx.Bool(5);
  if (!training && (!ctx.is_tensor(3) || !ctx.is_tensor(4))) {
    return ShapeError(ctx, "running_mean and running_var must be defined in evaluation mode");
  }
  const Dim channels = input[1];
  absl::Status st = CheckChannels(ctx, 1, channels, "weight has one element per channel");
  if (st.ok()) st = CheckChannels(ctx, 2, channels, "bias has one element per channel");
  if (st.ok()) st = CheckChannels(ctx, 3, channels, "running_mean has one element per channel");
  if (st.ok()) st = CheckChannels(ctx, 4, channels, "running_var has one element per channel");
  return st;
}

// batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps, cudnn).
absl::StatusOr<Shapes> BatchNorm(const ShapeContext& ctx) {
  absl::Status st = CheckBatchNorm(ctx);
  if (!st.ok()) return st;
  return Shapes{ctx.shape(0)};
}

// native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps)
// -> (out, save_mean, save_invstd). The CPU kernel saves per-channel statistics only when
// training; in evaluation it returns two empty [0] tensors.
absl::StatusOr<Shapes> NativeBatchNorm(const ShapeContext& ctx) {
  absl::Status st = CheckBatchNorm(ctx);
  if (!st.ok()) return st;
  const Shape& input = ctx.shape(0);
  const Shape stat = ctx.Bool(5) ? Shape{input[1]} : Shape{0};
  return Shapes{input, stat, stat};
}

}  // namespace

WARDEN_REGISTER_OPS(norm) {
  r.Add({"aten::layer_norm", LayerNorm});
  r.Add({"aten::native_layer_norm", NativeLayerNorm});
  r.Add({"aten::group_norm", GroupNorm});
  r.Add({"aten::native_group_norm", NativeGroupNorm});
  r.Add({"aten::batch_norm", BatchNorm});
  r.Add({"aten::native_batch_norm", NativeBatchNorm});
  // instance_norm normalizes each (sample, channel) slice; the output is the input's shape.
  r.Add({"aten::instance_norm", SameAs(0)});
}

}  // namespace warden::ops
