// Shape rules of factories (zeros, full, arange, eye, the *_like family, ...) and of random
// sampling (rand, randint, normal, bernoulli, multinomial, in-place fills like uniform_).
// Factories take their sizes from constant arguments; random ops are marked so replay redraws.

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "ops/registry.h"

namespace warden::ops {
namespace {

using Shapes = std::vector<Shape>;

// The position of an argument an overload does not have (arange without start or step).
constexpr size_t kAbsent = SIZE_MAX;

// A size list argument, as ATen's check_size_nonnegative sees it.
absl::StatusOr<Shape> SizeList(const ShapeContext& ctx, size_t i) {
  const std::vector<Dim> sizes = ctx.Dims(i);
  for (const Dim& s : sizes) {
    if (ConstantBelow(s, 0)) return ShapeError(ctx, "trying to create tensor with negative dimension ", s);
  }
  return sizes;
}

// The rule "the output has the sizes given by argument i".
ShapeRule SizesAt(size_t i) {
  return [i](const ShapeContext& ctx) -> absl::StatusOr<Shapes> {
    absl::StatusOr<Shape> s = SizeList(ctx, i);
    if (!s.ok()) return s.status();
    return Shapes{*s};
  };
}

// randint(high, size) and randint.low(low, high, size): the range must be non-empty.
ShapeRule Randint(bool has_low) {
  return [has_low](const ShapeContext& ctx) -> absl::StatusOr<Shapes> {
    const size_t base = has_low ? 1 : 0;
    const int64_t low = has_low ? ctx.Int(0) : 0;
    const int64_t high = ctx.Int(base);
    if (low >= high) {
      return ShapeError(ctx, "random_ expects 'from' to be less than 'to', but got from=", low,
                        " >= to=", high);
    }
    absl::StatusOr<Shape> s = SizeList(ctx, base + 1);
    if (!s.ok()) return s.status();
    return Shapes{*s};
  };
}

// Note [arange length]
// ATen (RangeFactories.cpp) checks the bounds in the result dtype's accumulate type and computes
// the length as ceil((end - start) / step) in double, with one exception that changes results:
// for an int64 result (the default when start, end and step are all ints) the length uses the
// truncated values. So arange(0, 2.5, dtype=long) has 2 elements while arange(0, 2.5,
// dtype=int32) has 3, and a fractional step is an error ("step must be nonzero") for every
// integral dtype. The rule reproduces this.
absl::StatusOr<Shapes> Arange(const ShapeContext& ctx, size_t start_arg, size_t end_arg,
                              size_t step_arg, size_t dtype_arg) {
  auto value = [&ctx](size_t i, double fallback) {
    return i == kAbsent ? fallback : ScalarArg(ctx, i);
  };
  auto is_int = [&ctx](size_t i) {
    return i == kAbsent || ctx.arg(i).constant.isInt() || ctx.arg(i).constant.isBool();
  };
  const double start = value(start_arg, 0);
  const double end = value(end_arg, 0);
  const double step = value(step_arg, 1);
  const bool all_ints = is_int(start_arg) && is_int(end_arg) && is_int(step_arg);
  bool integral = all_ints;
  bool int64 = all_ints;
  if (!ctx.is_none(dtype_arg) && ctx.arg(dtype_arg).constant.isInt()) {
    const auto dtype = static_cast<c10::ScalarType>(ctx.Int(dtype_arg));
    integral = c10::isIntegralType(dtype, /*includeBool=*/true);
    int64 = dtype == c10::ScalarType::Long;
  }
  if (!std::isfinite(start) || !std::isfinite(end)) {
    return ShapeError(ctx, "unsupported range: ", start, " -> ", end);
  }
  // The values in the accumulate type: integral accumulate types truncate.
  const double acc_start = integral ? std::trunc(start) : start;
  const double acc_end = integral ? std::trunc(end) : end;
  const double acc_step = integral ? std::trunc(step) : step;
  if (acc_step == 0) return ShapeError(ctx, "step must be nonzero");
  if (!((acc_step > 0 && acc_end >= acc_start) || (acc_step < 0 && acc_end <= acc_start))) {
    return ShapeError(ctx, "upper bound and larger bound inconsistent with step sign");
  }
  const double length = int64 ? std::ceil((acc_end - acc_start) / acc_step)
                              : std::ceil((end - start) / step);
  if (!(length >= 0 && length <= static_cast<double>(std::numeric_limits<int64_t>::max()))) {
    return ShapeError(ctx, "invalid arange length ", length);
  }
  return Shapes{Shape{static_cast<Dim>(length)}};
}

// linspace/logspace(start, end, steps, ...): `steps` points.
absl::StatusOr<Shapes> Linspace(const ShapeContext& ctx) {
  const int64_t steps = ctx.Int(2);
  if (steps < 0) return ShapeError(ctx, "number of steps must be non-negative");
  return Shapes{Shape{steps}};
}

// eye(n) and eye.m(n, m).
ShapeRule Eye(bool has_m) {
  return [has_m](const ShapeContext& ctx) -> absl::StatusOr<Shapes> {
    const int64_t n = ctx.Int(0);
    const int64_t m = has_m ? ctx.Int(1) : n;
    if (n < 0) return ShapeError(ctx, "n must be greater or equal to 0, got ", n);
    if (m < 0) return ShapeError(ctx, "m must be greater or equal to 0, got ", m);
    return Shapes{Shape{n, m}};
  };
}

// randperm(n).
absl::StatusOr<Shapes> Randperm(const ShapeContext& ctx) {
  const int64_t n = ctx.Int(0);
  if (n < 0) return ShapeError(ctx, "n must be non-negative, got ", n);
  return Shapes{Shape{n}};
}

// multinomial(self [n] or [batch, n], num_samples, replacement): num_samples per distribution.
absl::StatusOr<Shapes> Multinomial(const ShapeContext& ctx) {
  Shape out = ctx.shape(0);
  if (out.size() != 1 && out.size() != 2) {
    return ShapeError(ctx, "prob_dist must be 1 or 2 dim, got ", out.size());
  }
  const int64_t samples = ctx.Int(1);
  if (samples <= 0) return ShapeError(ctx, "cannot sample n_sample <= 0 samples");
  if (!ctx.Bool(2) && SizeLess(ctx, out.back(), samples, "multinomial without replacement")) {
    return ShapeError(ctx, "cannot sample n_sample > prob_dist.size(-1) samples without "
                      "replacement");
  }
  out.back() = samples;
  return Shapes{out};
}

}  // namespace

WARDEN_REGISTER_OPS(factory) {
  auto add = [&r](std::initializer_list<const char*> names, const ShapeRule& rule, bool random,
                  bool factory) {
    for (const char* name : names) r.Add({name, rule, random, factory});
  };
  constexpr bool kRandom = true;
  constexpr bool kFactory = true;

  // Sizes given as a list.
  add({"aten::zeros", "aten::ones", "aten::empty.memory_format", "aten::full",
       "aten::empty_strided"},
      SizesAt(0), !kRandom, kFactory);
  add({"aten::new_zeros", "aten::new_ones", "aten::new_empty", "aten::new_full"}, SizesAt(1),
      !kRandom, kFactory);
  add({"aten::rand", "aten::rand.generator", "aten::randn", "aten::randn.generator"}, SizesAt(0),
      kRandom, kFactory);
  add({"aten::normal.float_float"}, SizesAt(2), kRandom, kFactory);
  add({"aten::randint", "aten::randint.generator"}, Randint(/*has_low=*/false), kRandom,
      kFactory);
  add({"aten::randint.low", "aten::randint.low_generator"}, Randint(/*has_low=*/true), kRandom,
      kFactory);
  add({"aten::randperm", "aten::randperm.generator"}, Randperm, kRandom, kFactory);

  // Sizes computed from scalars.
  add({"aten::arange"},
      [](const ShapeContext& ctx) { return Arange(ctx, kAbsent, 0, kAbsent, 1); }, !kRandom,
      kFactory);
  add({"aten::arange.start"},
      [](const ShapeContext& ctx) { return Arange(ctx, 0, 1, kAbsent, 2); }, !kRandom, kFactory);
  add({"aten::arange.start_step"},
      [](const ShapeContext& ctx) { return Arange(ctx, 0, 1, 2, 3); }, !kRandom, kFactory);
  add({"aten::linspace", "aten::logspace"}, Linspace, !kRandom, kFactory);
  add({"aten::eye"}, Eye(/*has_m=*/false), !kRandom, kFactory);
  add({"aten::eye.m"}, Eye(/*has_m=*/true), !kRandom, kFactory);
  add({"aten::scalar_tensor"},
      [](const ShapeContext& ctx) -> absl::StatusOr<Shapes> { return Shapes{Shape{}}; },
      !kRandom, kFactory);

  // The *_like family reads only its input's metadata, never its values.
  add({"aten::zeros_like", "aten::ones_like", "aten::empty_like", "aten::full_like"}, SameAs(0),
      !kRandom, kFactory);
  add({"aten::rand_like", "aten::randn_like", "aten::randint_like",
       "aten::randint_like.low_dtype"},
      SameAs(0), kRandom, kFactory);

  // Random ops over an input tensor: not factories (their values or shapes come from an input).
  add({"aten::normal.Tensor_float", "aten::bernoulli", "aten::bernoulli.p", "aten::poisson",
       "aten::normal_", "aten::uniform_", "aten::bernoulli_.float", "aten::random_",
       "aten::random_.from", "aten::random_.to", "aten::exponential_", "aten::cauchy_",
       "aten::log_normal_", "aten::geometric_"},
      SameAs(0), kRandom, !kFactory);
  add({"aten::normal.float_Tensor"}, SameAs(1), kRandom, !kFactory);
  add({"aten::normal.Tensor_Tensor"}, BroadcastAll(), kRandom, !kFactory);
  // The probability tensor broadcasts into self.
  add({"aten::bernoulli.Tensor", "aten::bernoulli_.Tensor"}, InPlaceBroadcast(), kRandom,
      !kFactory);
  add({"aten::multinomial"}, Multinomial, kRandom, !kFactory);
}

}  // namespace warden::ops
