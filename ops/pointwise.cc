// Shape rules of the pointwise family: unary math and activations, dtype/device conversions and
// copies, binary and ternary ops with broadcasting, comparisons, and their in-place `_` variants.
// Everything here returns one tensor whose shape is an input's or the broadcast of the inputs.

#include <initializer_list>

#include "ops/registry.h"

namespace warden::ops {
namespace {

using Shapes = std::vector<Shape>;

// fill_.Tensor and masked_fill.Tensor take their value as a tensor, but ATen only accepts a
// 0-dim one (it is a scalar that happens to live on a device).
absl::Status RequireZeroDimValue(const ShapeContext& ctx, size_t i) {
  if (ctx.shape(i).empty()) return absl::OkStatus();
  return ShapeError(ctx, "value must be a 0-dim tensor, got rank ", ctx.shape(i).size());
}

// The value is checked to be 0-dim, so only self and the mask broadcast.
absl::StatusOr<Shapes> MaskedFillTensor(const ShapeContext& ctx) {
  absl::Status st = RequireZeroDimValue(ctx, 2);
  if (!st.ok()) return st;
  absl::StatusOr<Shape> out = Broadcast(ctx, ctx.shape(0), ctx.shape(1));
  if (!out.ok()) return out.status();
  return Shapes{*out};
}

absl::StatusOr<Shapes> MaskedFillTensorInPlace(const ShapeContext& ctx) {
  absl::Status st = RequireZeroDimValue(ctx, 2);
  if (!st.ok()) return st;
  st = RequireExpandable(ctx, ctx.shape(1), ctx.shape(0), "in-place broadcast of the mask");
  if (!st.ok()) return st;
  return Shapes{ctx.shape(0)};
}

absl::StatusOr<Shapes> FillTensor(const ShapeContext& ctx) {
  absl::Status st = RequireZeroDimValue(ctx, 1);
  if (!st.ok()) return st;
  return Shapes{ctx.shape(0)};
}

}  // namespace

WARDEN_REGISTER_OPS(pointwise) {
  auto add = [&r](std::initializer_list<const char*> names, const ShapeRule& rule) {
    for (const char* name : names) r.Add({name, rule});
  };

  // Unary ops: the output has the input's shape. Each is listed with its in-place variant where
  // 1.13 has one (softplus, isnan, isinf, isfinite and positive have none).
  add({"aten::relu", "aten::relu_", "aten::gelu", "aten::gelu_", "aten::sigmoid",
       "aten::sigmoid_", "aten::tanh", "aten::tanh_", "aten::exp", "aten::exp_", "aten::log",
       "aten::log_", "aten::sqrt", "aten::sqrt_", "aten::rsqrt", "aten::rsqrt_", "aten::neg",
       "aten::neg_", "aten::abs", "aten::abs_", "aten::sin", "aten::sin_", "aten::cos",
       "aten::cos_", "aten::tan", "aten::tan_", "aten::asin", "aten::asin_", "aten::acos",
       "aten::acos_", "aten::atan", "aten::atan_", "aten::sinh", "aten::sinh_", "aten::cosh",
       "aten::cosh_", "aten::erf", "aten::erf_", "aten::erfc", "aten::erfc_", "aten::erfinv",
       "aten::erfinv_", "aten::log1p", "aten::log1p_", "aten::log2", "aten::log2_",
       "aten::log10", "aten::log10_", "aten::expm1", "aten::expm1_", "aten::exp2",
       "aten::exp2_", "aten::reciprocal", "aten::reciprocal_", "aten::silu", "aten::silu_",
       "aten::mish", "aten::mish_", "aten::hardsigmoid", "aten::hardsigmoid_",
       "aten::hardswish", "aten::hardswish_", "aten::selu", "aten::selu_", "aten::celu",
       "aten::celu_", "aten::relu6", "aten::relu6_", "aten::hardtanh", "aten::hardtanh_",
       "aten::leaky_relu", "aten::leaky_relu_", "aten::elu", "aten::elu_", "aten::softplus",
       "aten::threshold", "aten::threshold_", "aten::logit", "aten::logit_", "aten::clamp",
       "aten::clamp_", "aten::clamp_min", "aten::clamp_min_", "aten::clamp_max",
       "aten::clamp_max_", "aten::bitwise_not", "aten::bitwise_not_", "aten::logical_not",
       "aten::logical_not_", "aten::sign", "aten::sign_", "aten::sgn", "aten::sgn_",
       "aten::frac", "aten::frac_", "aten::floor", "aten::floor_", "aten::ceil", "aten::ceil_",
       "aten::round", "aten::round_", "aten::round.decimals", "aten::round_.decimals",
       "aten::trunc", "aten::trunc_", "aten::square", "aten::square_", "aten::isnan",
       "aten::isinf", "aten::isfinite", "aten::nan_to_num", "aten::nan_to_num_",
       "aten::positive"},
      SameAs(0));

  // Conversions, copies and aliases keep the shape; dtype, device and memory format are not
  // shape properties.
  add({"aten::to.dtype", "aten::to.dtype_layout", "aten::to.other", "aten::to.device",
       "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::type_as", "aten::detach",
       "aten::detach_", "aten::alias", "aten::lift_fresh", "aten::fill_.Scalar",
       "aten::zero_"},
      SameAs(0));
  // requires_grad_ is composite (it sets the flag through TensorBase): recorded rather than
  // decomposed, so that replay sets the flag on the real tensor (tracer Note [Autograd inside the
  // trace]).
  r.Add({"aten::requires_grad_", SameAs(0)});
  r.Add({"aten::fill_.Tensor", FillTensor});
  // copy_ broadcasts its source into self.
  r.Add({"aten::copy_", InPlaceBroadcast()});

  // Dropout draws its mask from the generator; native_dropout also returns the mask.
  r.Add({"aten::dropout", SameAs(0), /*random=*/true});
  r.Add({"aten::dropout_", SameAs(0), /*random=*/true});
  r.Add({"aten::feature_dropout", SameAs(0), /*random=*/true});
  r.Add({"aten::native_dropout",
         [](const ShapeContext& ctx) -> absl::StatusOr<Shapes> {
           return Shapes{ctx.shape(0), ctx.shape(0)};
         },
         /*random=*/true});

  // Binary and ternary ops broadcast every tensor argument; Scalar overloads (including those
  // whose self is the Scalar, like pow.Scalar) have a single tensor, so the same rule applies.
  add({"aten::add.Tensor", "aten::add.Scalar", "aten::sub.Tensor", "aten::sub.Scalar",
       "aten::mul.Tensor", "aten::mul.Scalar", "aten::div.Tensor", "aten::div.Scalar",
       "aten::div.Tensor_mode", "aten::div.Scalar_mode", "aten::true_divide.Tensor",
       "aten::true_divide.Scalar", "aten::floor_divide", "aten::floor_divide.Scalar",
       "aten::rsub.Tensor", "aten::rsub.Scalar", "aten::remainder.Tensor",
       "aten::remainder.Scalar", "aten::remainder.Scalar_Tensor", "aten::fmod.Tensor",
       "aten::fmod.Scalar", "aten::maximum", "aten::minimum", "aten::max.other",
       "aten::min.other", "aten::atan2", "aten::hypot", "aten::logaddexp",
       "aten::copysign.Tensor", "aten::copysign.Scalar", "aten::xlogy.Tensor",
       "aten::xlogy.Scalar_Self", "aten::xlogy.Scalar_Other", "aten::pow.Tensor_Tensor",
       "aten::pow.Tensor_Scalar", "aten::pow.Scalar", "aten::float_power.Tensor_Tensor",
       "aten::float_power.Tensor_Scalar", "aten::float_power.Scalar", "aten::eq.Tensor",
       "aten::eq.Scalar", "aten::ne.Tensor", "aten::ne.Scalar", "aten::lt.Tensor",
       "aten::lt.Scalar", "aten::le.Tensor", "aten::le.Scalar", "aten::gt.Tensor",
       "aten::gt.Scalar", "aten::ge.Tensor", "aten::ge.Scalar", "aten::logical_and",
       "aten::logical_or", "aten::logical_xor", "aten::bitwise_and.Tensor",
       "aten::bitwise_and.Scalar", "aten::bitwise_and.Scalar_Tensor", "aten::bitwise_or.Tensor",
       "aten::bitwise_or.Scalar", "aten::bitwise_or.Scalar_Tensor", "aten::bitwise_xor.Tensor",
       "aten::bitwise_xor.Scalar", "aten::bitwise_xor.Scalar_Tensor", "aten::clamp.Tensor",
       "aten::clamp_min.Tensor", "aten::clamp_max.Tensor", "aten::where.self",
       "aten::where.ScalarSelf", "aten::where.ScalarOther", "aten::where.Scalar",
       "aten::masked_fill.Scalar", "aten::lerp.Scalar", "aten::lerp.Tensor", "aten::addcmul",
       "aten::addcdiv"},
      BroadcastAll());
  r.Add({"aten::masked_fill.Tensor", MaskedFillTensor});

  // In-place variants write into self, so the other operands must broadcast into it.
  add({"aten::add_.Tensor", "aten::add_.Scalar", "aten::sub_.Tensor", "aten::sub_.Scalar",
       "aten::mul_.Tensor", "aten::mul_.Scalar", "aten::div_.Tensor", "aten::div_.Scalar",
       "aten::div_.Tensor_mode", "aten::div_.Scalar_mode", "aten::true_divide_.Tensor",
       "aten::true_divide_.Scalar", "aten::floor_divide_.Tensor", "aten::floor_divide_.Scalar",
       "aten::remainder_.Tensor", "aten::remainder_.Scalar", "aten::fmod_.Tensor",
       "aten::fmod_.Scalar", "aten::atan2_", "aten::hypot_", "aten::copysign_.Tensor",
       "aten::copysign_.Scalar", "aten::xlogy_.Tensor", "aten::xlogy_.Scalar_Other",
       "aten::pow_.Tensor", "aten::pow_.Scalar", "aten::float_power_.Tensor",
       "aten::float_power_.Scalar", "aten::eq_.Tensor", "aten::eq_.Scalar", "aten::ne_.Tensor",
       "aten::ne_.Scalar", "aten::lt_.Tensor", "aten::lt_.Scalar", "aten::le_.Tensor",
       "aten::le_.Scalar", "aten::gt_.Tensor", "aten::gt_.Scalar", "aten::ge_.Tensor",
       "aten::ge_.Scalar", "aten::logical_and_", "aten::logical_or_", "aten::logical_xor_",
       "aten::bitwise_and_.Tensor", "aten::bitwise_and_.Scalar", "aten::bitwise_or_.Tensor",
       "aten::bitwise_or_.Scalar", "aten::bitwise_xor_.Tensor", "aten::bitwise_xor_.Scalar",
       "aten::clamp_.Tensor", "aten::clamp_min_.Tensor", "aten::clamp_max_.Tensor",
       "aten::masked_fill_.Scalar", "aten::lerp_.Scalar", "aten::lerp_.Tensor",
       "aten::addcmul_", "aten::addcdiv_"},
      InPlaceBroadcast());
  r.Add({"aten::masked_fill_.Tensor", MaskedFillTensorInPlace});
}

}  // namespace warden::ops
