// Differential tests of the ops/ shape rules: each case calls the real LibTorch 1.13 op through
// the dispatcher and compares the real output shapes with the rule's. Also: invalid shapes fail
// in both, every registered name is a real schema, and most registered ops have a case.

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/registry.h"

namespace warden::ops {
namespace {

using ::testing::HasSubstr;

// --- Argument builders ------------------------------------------------------------------------

// Float values in [0.1, 0.9): valid probabilities, logs and inverse-trig inputs alike.
c10::IValue F(std::vector<int64_t> sizes) { return torch::rand(sizes) * 0.8 + 0.1; }
c10::IValue D(std::vector<int64_t> sizes) { return torch::rand(sizes, torch::kDouble); }
// Indices in [0, high).
c10::IValue L(std::vector<int64_t> sizes, int64_t high = 2) {
  return torch::randint(high, sizes, torch::kLong);
}
c10::IValue B(std::vector<int64_t> sizes) { return torch::rand(sizes) > 0.5; }
c10::IValue I(std::vector<int64_t> ints) { return c10::IValue(ints); }
c10::IValue None() { return c10::IValue(); }
c10::IValue List(const std::vector<c10::IValue>& tensors) {
  c10::List<at::Tensor> list;
  for (const c10::IValue& t : tensors) list.push_back(t.toTensor());
  return c10::IValue(list);
}

// One call: leading positional arguments, then named ones; the rest take schema defaults (or
// None for optional arguments without one).
struct Case {
  std::string op;  // "aten::add.Tensor"
  std::vector<c10::IValue> args;
  std::vector<std::pair<std::string, c10::IValue>> kwargs = {};
};

std::pair<std::string, std::string> SplitName(const std::string& op) {
  const size_t dot = op.find('.');
  if (dot == std::string::npos) return {op, ""};
  return {op.substr(0, dot), op.substr(dot + 1)};
}

c10::OperatorHandle Handle(const std::string& op) {
  const auto [name, overload] = SplitName(op);
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
}

std::string Describe(const c10::IValue& v) {
  std::ostringstream os;
  if (v.isTensor()) {
    os << "T" << v.toTensor().sizes();
  } else if (v.isTensorList()) {
    os << "[";
    for (const at::Tensor& t : v.toTensorVector()) os << "T" << t.sizes() << " ";
    os << "]";
  } else {
    os << v;
  }
  return os.str();
}

std::string Describe(const Case& c) {
  std::string out = c.op + "(";
  for (const c10::IValue& v : c.args) out += Describe(v) + ", ";
  for (const auto& [name, v] : c.kwargs) out += name + "=" + Describe(v) + ", ";
  return out + ")";
}

// The full schema-ordered stack of a case.
std::vector<c10::IValue> FullStack(const Case& c) {
  const c10::FunctionSchema& schema = Handle(c.op).schema();
  std::vector<c10::IValue> stack;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (i < c.args.size()) {
      stack.push_back(c.args[i]);
      continue;
    }
    auto named = std::find_if(c.kwargs.begin(), c.kwargs.end(),
                              [&](const auto& kv) { return kv.first == args[i].name(); });
    if (named != c.kwargs.end()) {
      stack.push_back(named->second);
    } else if (args[i].default_value().has_value()) {
      stack.push_back(*args[i].default_value());
    } else if (args[i].type()->kind() == c10::TypeKind::OptionalType) {
      stack.push_back(None());
    } else {
      ADD_FAILURE() << Describe(c) << ": no value for argument " << args[i].name();
      stack.push_back(None());
    }
  }
  return stack;
}

Shape ShapeOf(const at::Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end()); }

// What the tracer will do: tensors become shapes, undefined tensors None, the rest constants.
ShapeContext ToContext(const std::string& op, const std::vector<c10::IValue>& stack) {
  std::vector<ShapeContext::Arg> args;
  for (const c10::IValue& v : stack) {
    ShapeContext::Arg a;
    if (v.isTensor() && v.toTensor().defined()) {
      a.kind = ShapeContext::Arg::Kind::kTensor;
      a.shape = ShapeOf(v.toTensor());
    } else if (v.isTensor() || v.isNone()) {
      a.kind = ShapeContext::Arg::Kind::kNone;
    } else if (v.isTensorList()) {
      a.kind = ShapeContext::Arg::Kind::kTensorList;
      for (const at::Tensor& t : v.toTensorVector()) a.list.push_back(ShapeOf(t));
    } else if (v.isOptionalTensorList()) {
      a.kind = ShapeContext::Arg::Kind::kTensorList;
      for (const c10::IValue& t : v.toListRef()) {
        a.list.push_back(t.isTensor() ? ShapeOf(t.toTensor()) : Shape{});
      }
    } else {
      a.kind = ShapeContext::Arg::Kind::kConstant;
      a.constant = v;
    }
    args.push_back(std::move(a));
  }
  return ShapeContext(op, std::move(args));
}

// The shapes the real op returned (a Tensor[] return contributes one per element).
std::vector<Shape> RealShapes(const std::vector<c10::IValue>& returns) {
  std::vector<Shape> out;
  for (const c10::IValue& v : returns) {
    if (v.isTensor()) {
      out.push_back(ShapeOf(v.toTensor()));
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) out.push_back(ShapeOf(t));
    }
  }
  return out;
}

std::string ToString(const std::vector<Shape>& shapes) {
  std::ostringstream os;
  for (const Shape& s : shapes) os << tracer::SymShapeString(s) << " ";
  return os.str();
}

// kDataDependentSize in a rule's shape matches any real size.
bool Matches(const std::vector<Shape>& rule, const std::vector<Shape>& real) {
  if (rule.size() != real.size()) return false;
  for (size_t i = 0; i < rule.size(); ++i) {
    if (rule[i].size() != real[i].size()) return false;
    for (size_t d = 0; d < rule[i].size(); ++d) {
      if (rule[i][d] != kDataDependentSize && rule[i][d] != real[i][d]) return false;
    }
  }
  return true;
}

// --- Cases ----------------------------------------------------------------------------------

void AddUnaryCases(std::vector<Case>& cases) {
  for (const char* op :
       {"aten::relu", "aten::relu_", "aten::gelu", "aten::gelu_", "aten::sigmoid",
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
        "aten::logit", "aten::logit_", "aten::logical_not", "aten::logical_not_", "aten::sign",
        "aten::sign_", "aten::sgn", "aten::sgn_", "aten::frac", "aten::frac_", "aten::floor",
        "aten::floor_", "aten::ceil", "aten::ceil_", "aten::round", "aten::round_",
        "aten::trunc", "aten::trunc_", "aten::square", "aten::square_", "aten::isnan",
        "aten::isinf", "aten::isfinite", "aten::nan_to_num", "aten::nan_to_num_",
        "aten::positive", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::detach",
        "aten::detach_", "aten::alias", "aten::lift_fresh", "aten::zero_"}) {
    cases.push_back({op, {F({2, 3})}});
    cases.push_back({op, {F({0, 3})}});
    cases.push_back({op, {F({})}});
  }
  for (const char* op : {"aten::bitwise_not", "aten::bitwise_not_"}) {
    cases.push_back({op, {L({2, 3})}});
  }
  std::vector<Case> more = {
      {"aten::round.decimals", {F({2, 3})}, {{"decimals", 2}}},
      {"aten::round_.decimals", {F({2, 3})}, {{"decimals", 1}}},
      {"aten::threshold", {F({2, 3}), 0.5, 0.0}},
      {"aten::threshold_", {F({4}), 0.5, 0.0}},
      {"aten::clamp", {F({2, 3}), 0.2}},
      {"aten::clamp", {F({2, 3}), None(), 0.5}},
      {"aten::clamp_", {F({2, 3}), 0.2, 0.5}},
      {"aten::clamp_min", {F({2, 3}), 0.2}},
      {"aten::clamp_min_", {F({2, 3}), 0.2}},
      {"aten::clamp_max", {F({2, 3}), 0.2}},
      {"aten::clamp_max_", {F({2, 3}), 0.2}},
      {"aten::dropout", {F({2, 3}), 0.5, true}},
      {"aten::dropout_", {F({2, 3}), 0.5, true}},
      {"aten::feature_dropout", {F({2, 3, 4}), 0.5, true}},
      {"aten::native_dropout", {F({2, 3}), 0.5, true}},
      {"aten::to.dtype", {F({2, 3}), c10::ScalarType::Double}},
      {"aten::to.dtype_layout", {F({2, 3})}, {{"dtype", c10::ScalarType::Int}}},
      {"aten::to.other", {F({2, 3}), L({5})}},
      {"aten::to.device", {F({2, 3}), c10::Device("cpu"), c10::ScalarType::Float}},
      {"aten::type_as", {F({2, 3}), L({1})}},
      {"aten::fill_.Scalar", {F({2, 3}), 1.5}},
      {"aten::fill_.Tensor", {F({2, 3}), F({})}},
      {"aten::copy_", {F({2, 3}), F({3})}},
      {"aten::copy_", {F({2, 3}), F({2, 1})}},
  };
  cases.insert(cases.end(), more.begin(), more.end());
}

void AddBinaryCases(std::vector<Case>& cases) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> pairs = {
      {{2, 3}, {3}}, {{4, 1, 3}, {2, 1}}, {{}, {2}}, {{0, 3}, {1, 3}}, {{1}, {5}}};
  for (const char* op :
       {"aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor",
        "aten::true_divide.Tensor", "aten::floor_divide", "aten::rsub.Tensor",
        "aten::remainder.Tensor", "aten::fmod.Tensor", "aten::maximum", "aten::minimum",
        "aten::max.other", "aten::min.other", "aten::atan2", "aten::hypot", "aten::logaddexp",
        "aten::copysign.Tensor", "aten::xlogy.Tensor", "aten::pow.Tensor_Tensor",
        "aten::float_power.Tensor_Tensor", "aten::eq.Tensor", "aten::ne.Tensor",
        "aten::lt.Tensor", "aten::le.Tensor", "aten::gt.Tensor", "aten::ge.Tensor",
        "aten::logical_and", "aten::logical_or", "aten::logical_xor", "aten::clamp_min.Tensor",
        "aten::clamp_max.Tensor", "aten::normal.Tensor_Tensor"}) {
    for (const auto& [a, b] : pairs) cases.push_back({op, {F(a), F(b)}});
  }
  for (const char* op : {"aten::bitwise_and.Tensor", "aten::bitwise_or.Tensor",
                         "aten::bitwise_xor.Tensor"}) {
    for (const auto& [a, b] : pairs) cases.push_back({op, {L(a), L(b)}});
  }
  cases.push_back({"aten::div.Tensor_mode", {F({2, 3}), F({3})}, {{"rounding_mode", "floor"}}});
  cases.push_back({"aten::div.Scalar_mode", {F({2, 3}), 2.0}, {{"rounding_mode", "trunc"}}});
  cases.push_back({"aten::div_.Tensor_mode", {F({2, 3}), F({3})}, {{"rounding_mode", "floor"}}});
  cases.push_back({"aten::div_.Scalar_mode", {F({2, 3}), 2.0}, {{"rounding_mode", "trunc"}}});

  // Tensor-Scalar overloads.
  for (const char* op :
       {"aten::add.Scalar", "aten::sub.Scalar", "aten::mul.Scalar", "aten::div.Scalar",
        "aten::true_divide.Scalar", "aten::floor_divide.Scalar", "aten::rsub.Scalar",
        "aten::remainder.Scalar", "aten::fmod.Scalar", "aten::copysign.Scalar",
        "aten::xlogy.Scalar_Other", "aten::pow.Tensor_Scalar", "aten::float_power.Tensor_Scalar",
        "aten::eq.Scalar", "aten::ne.Scalar", "aten::lt.Scalar", "aten::le.Scalar",
        "aten::gt.Scalar", "aten::ge.Scalar"}) {
    cases.push_back({op, {F({2, 3}), 2.0}});
    cases.push_back({op, {F({}), 2}});
  }
  for (const char* op : {"aten::bitwise_and.Scalar", "aten::bitwise_or.Scalar",
                         "aten::bitwise_xor.Scalar"}) {
    cases.push_back({op, {L({2, 3}), 3}});
  }
  // Scalar-Tensor overloads.
  for (const char* op : {"aten::remainder.Scalar_Tensor", "aten::xlogy.Scalar_Self",
                         "aten::pow.Scalar", "aten::float_power.Scalar"}) {
    cases.push_back({op, {2.0, F({2, 3})}});
  }
  for (const char* op : {"aten::bitwise_and.Scalar_Tensor", "aten::bitwise_or.Scalar_Tensor",
                         "aten::bitwise_xor.Scalar_Tensor"}) {
    cases.push_back({op, {3, L({2, 3})}});
  }

  // In-place: the other operand broadcasts into self.
  const std::vector<std::vector<int64_t>> into = {{3}, {1, 3}, {}, {2, 3}};
  for (const char* op :
       {"aten::add_.Tensor", "aten::sub_.Tensor", "aten::mul_.Tensor", "aten::div_.Tensor",
        "aten::true_divide_.Tensor", "aten::floor_divide_.Tensor", "aten::remainder_.Tensor",
        "aten::fmod_.Tensor", "aten::atan2_", "aten::hypot_", "aten::copysign_.Tensor",
        "aten::xlogy_.Tensor", "aten::pow_.Tensor", "aten::eq_.Tensor", "aten::ne_.Tensor",
        "aten::lt_.Tensor", "aten::le_.Tensor", "aten::gt_.Tensor", "aten::ge_.Tensor",
        "aten::logical_and_", "aten::logical_or_", "aten::logical_xor_",
        "aten::clamp_min_.Tensor", "aten::clamp_max_.Tensor", "aten::bernoulli_.Tensor"}) {
    for (const auto& b : into) cases.push_back({op, {F({2, 3}), F(b)}});
  }
  for (const char* op : {"aten::bitwise_and_.Tensor", "aten::bitwise_or_.Tensor",
                         "aten::bitwise_xor_.Tensor"}) {
    cases.push_back({op, {L({2, 3}), L({3})}});
  }
  cases.push_back({"aten::float_power_.Tensor", {D({2, 3}), D({3})}});
  cases.push_back({"aten::float_power_.Scalar", {D({2, 3}), 2.0}});
  for (const char* op :
       {"aten::add_.Scalar", "aten::sub_.Scalar", "aten::mul_.Scalar", "aten::div_.Scalar",
        "aten::true_divide_.Scalar", "aten::floor_divide_.Scalar", "aten::remainder_.Scalar",
        "aten::fmod_.Scalar", "aten::copysign_.Scalar", "aten::xlogy_.Scalar_Other",
        "aten::pow_.Scalar", "aten::eq_.Scalar", "aten::ne_.Scalar", "aten::lt_.Scalar",
        "aten::le_.Scalar", "aten::gt_.Scalar", "aten::ge_.Scalar"}) {
    cases.push_back({op, {F({2, 3}), 2.0}});
  }
  for (const char* op : {"aten::bitwise_and_.Scalar", "aten::bitwise_or_.Scalar",
                         "aten::bitwise_xor_.Scalar"}) {
    cases.push_back({op, {L({2, 3}), 1}});
  }

  std::vector<Case> more = {
      {"aten::where.self", {B({2, 1}), F({3}), F({4, 1, 1})}},
      {"aten::where.self", {B({}), F({2, 3}), F({})}},
      {"aten::where.ScalarSelf", {B({2, 1}), 1.0, F({3})}},
      {"aten::where.ScalarOther", {B({3}), F({2, 1}), 0.0}},
      {"aten::where.Scalar", {B({2, 3}), 1.0, 0.0}},
      {"aten::masked_fill.Scalar", {F({2, 3}), B({3}), 1.0}},
      {"aten::masked_fill.Scalar", {F({3}), B({2, 3}), 1.0}},
      {"aten::masked_fill.Tensor", {F({2, 3}), B({2, 1}), F({})}},
      {"aten::masked_fill_.Scalar", {F({2, 3}), B({3}), 1.0}},
      {"aten::masked_fill_.Tensor", {F({2, 3}), B({2, 3}), F({})}},
      {"aten::lerp.Scalar", {F({2, 3}), F({3}), 0.5}},
      {"aten::lerp.Tensor", {F({2, 1}), F({3}), F({4, 1, 1})}},
      {"aten::lerp_.Scalar", {F({2, 3}), F({3}), 0.5}},
      {"aten::lerp_.Tensor", {F({2, 3}), F({3}), F({2, 1})}},
      {"aten::addcmul", {F({3}), F({2, 1}), F({4, 1, 3})}},
      {"aten::addcdiv", {F({2, 3}), F({3}), F({2, 3})}},
      {"aten::addcmul_", {F({2, 3}), F({3}), F({2, 1})}},
      {"aten::addcdiv_", {F({2, 3}), F({1}), F({3})}},
      {"aten::clamp.Tensor", {F({2, 3}), F({3}), None()}},
      {"aten::clamp.Tensor", {F({3}), F({2, 1}), F({4, 1, 1})}},
      {"aten::clamp_.Tensor", {F({2, 3}), F({3}), F({2, 1})}},
  };
  cases.insert(cases.end(), more.begin(), more.end());
}

void AddReductionCases(std::vector<Case>& cases) {
  for (const char* op : {"aten::sum", "aten::mean", "aten::prod", "aten::max", "aten::min",
                         "aten::all", "aten::any", "aten::var", "aten::std", "aten::norm.Scalar",
                         "aten::frobenius_norm", "aten::var_mean", "aten::std_mean",
                         "aten::argmax", "aten::argmin", "aten::count_nonzero",
                         "aten::linalg_vector_norm", "aten::aminmax", "aten::amax",
                         "aten::amin"}) {
    cases.push_back({op, {F({2, 3})}});
    cases.push_back({op, {F({})}});
  }
  for (const char* op : {"aten::sum.dim_IntList", "aten::mean.dim", "aten::amax", "aten::amin",
                         "aten::var.dim", "aten::std.dim",
                         "aten::var_mean.dim", "aten::std_mean.dim", "aten::frobenius_norm.dim"}) {
    cases.push_back({op, {F({2, 3, 4}), I({1})}});
    cases.push_back({op, {F({2, 3, 4}), I({-1, 0})}, {{"keepdim", true}}});
    cases.push_back({op, {F({2, 3, 4}), I({})}});
  }
  for (const char* op : {"aten::sum.dim_IntList", "aten::mean.dim"}) {
    cases.push_back({op, {F({0, 3}), I({0})}});
    cases.push_back({op, {F({2, 3}), None()}});
    cases.push_back({op, {F({2, 3}), None()}, {{"keepdim", true}}});
    cases.push_back({op, {F({}), I({0})}});
    cases.push_back({op, {F({}), I({-1})}, {{"keepdim", true}}});
  }
  for (const char* op : {"aten::var.correction", "aten::std.correction",
                         "aten::var_mean.correction", "aten::std_mean.correction"}) {
    cases.push_back({op, {F({2, 3}), I({1})}, {{"correction", 0}}});
    cases.push_back({op, {F({2, 3}), None()}, {{"keepdim", true}}});
    cases.push_back({op, {F({2, 3, 4}), I({0, 2})}, {{"keepdim", true}}});
  }
  for (const char* op : {"aten::max.dim", "aten::min.dim", "aten::prod.dim_int", "aten::all.dim",
                         "aten::any.dim", "aten::argmax", "aten::argmin"}) {
    cases.push_back({op, {F({2, 3}), 1}});
    cases.push_back({op, {F({2, 3}), -2, true}});
  }
  std::vector<Case> more = {
      {"aten::sum", {F({2, 3})}, {{"dtype", c10::ScalarType::Double}}},
      {"aten::argmax", {F({2, 3}), None(), true}},
      {"aten::argmin", {F({2, 3, 4}), None(), true}},
      {"aten::aminmax", {F({2, 3})}, {{"dim", 1}, {"keepdim", true}}},
      {"aten::aminmax", {F({2, 3})}, {{"dim", 0}}},
      {"aten::norm.ScalarOpt_dim", {F({2, 3}), 2.0, I({1}), true}},
      {"aten::norm.ScalarOpt_dim", {F({2, 3, 4}), None(), I({0, 2})}},
      {"aten::norm.ScalarOpt_dtype", {F({2, 3}), 2.0}, {{"dtype", c10::ScalarType::Double}}},
      {"aten::norm.ScalarOpt_dim_dtype", {F({2, 3}), 1.0, I({0}), false},
       {{"dtype", c10::ScalarType::Double}}},
      {"aten::linalg_vector_norm", {F({2, 3}), 2.0, I({1}), true}},
      {"aten::count_nonzero", {F({2, 3}), 1}},
      {"aten::count_nonzero.dim_IntList", {F({2, 3, 4}), I({0, 2})}},
      {"aten::count_nonzero.dim_IntList", {F({2, 3}), I({})}},
      {"aten::logsumexp", {F({2, 3, 4}), I({1})}},
      {"aten::logsumexp", {F({2, 3, 4}), I({-1, 0})}, {{"keepdim", true}}},
      {"aten::logsumexp", {F({2, 3, 4}), I({})}, {{"keepdim", true}}},
      {"aten::logsumexp", {F({0, 3}), I({})}},
      {"aten::logsumexp", {F({}), I({})}},
      {"aten::logsumexp", {F({}), I({0})}},
  };
  cases.insert(cases.end(), more.begin(), more.end());
  for (const char* op : {"aten::cumsum", "aten::cumsum_", "aten::cumprod", "aten::cumprod_",
                         "aten::softmax.int", "aten::log_softmax.int"}) {
    cases.push_back({op, {F({2, 3}), -1}});
    cases.push_back({op, {F({}), 0}});
  }
  for (const char* op : {"aten::_softmax", "aten::_log_softmax"}) {
    cases.push_back({op, {F({2, 3}), 0, false}});
  }
}

void AddLinalgCases(std::vector<Case>& cases) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> matmul = {
      {{3}, {3}},          {{2, 3}, {3}},       {{3}, {3, 4}},          {{2, 3}, {3, 4}},
      {{5, 2, 3}, {3}},    {{5, 2, 3}, {3, 4}}, {{3}, {5, 3, 4}},       {{2, 3}, {5, 3, 4}},
      {{5, 2, 3}, {5, 3, 4}}, {{5, 1, 2, 3}, {4, 3, 2}}, {{2, 0}, {0, 3}}, {{0, 2, 3}, {3}},
      {{3}, {2, 5, 3, 4}}, {{2, 5, 2, 3}, {3}}, {{1, 2, 3}, {4, 3, 2}}};
  for (const auto& [a, b] : matmul) cases.push_back({"aten::matmul", {F(a), F(b)}});
  std::vector<Case> more = {
      {"aten::mm", {F({2, 3}), F({3, 4})}},
      {"aten::mm", {F({0, 3}), F({3, 1})}},
      {"aten::bmm", {F({5, 2, 3}), F({5, 3, 4})}},
      {"aten::mv", {F({2, 3}), F({3})}},
      {"aten::outer", {F({2}), F({3})}},
      {"aten::ger", {F({2}), F({3})}},
      {"aten::dot", {F({3}), F({3})}},
      {"aten::vdot", {F({3}), F({3})}},
      {"aten::linear", {F({5, 3}), F({4, 3}), F({4})}},
      {"aten::linear", {F({2, 5, 3}), F({4, 3})}},
      {"aten::linear", {F({2, 5, 3}), F({4, 3}), F({4})}},
      {"aten::linear", {F({3}), F({4, 3}), F({4})}},
      {"aten::linear", {F({2, 3}), F({3})}},
      {"aten::linear", {F({3}), F({3}), F({})}},
      {"aten::addmm", {F({4}), F({2, 3}), F({3, 4})}},
      {"aten::addmm", {F({2, 1}), F({2, 3}), F({3, 4})}},
      {"aten::addmm_", {F({2, 4}), F({2, 3}), F({3, 4})}},
      {"aten::baddbmm", {F({1, 2, 4}), F({5, 2, 3}), F({5, 3, 4})}},
      {"aten::baddbmm_", {F({5, 2, 4}), F({5, 2, 3}), F({5, 3, 4})}},
      {"aten::addbmm", {F({4}), F({5, 2, 3}), F({5, 3, 4})}},
      {"aten::addmv", {F({1}), F({2, 3}), F({3})}},
      {"aten::addmv_", {F({2}), F({2, 3}), F({3})}},
      {"aten::addr", {F({2, 3}), F({2}), F({3})}},
  };
  cases.insert(cases.end(), more.begin(), more.end());
}

void AddViewCases(std::vector<Case>& cases) {
  std::vector<Case> more = {
      {"aten::view", {F({2, 3, 4}), I({6, -1})}},
      {"aten::view", {F({1}), I({})}},
      {"aten::reshape", {F({2, 3, 4}), I({-1})}},
      {"aten::reshape", {F({0, 3}), I({3, 0})}},
      {"aten::reshape", {F({0, 3}), I({-1, 3})}},
      {"aten::reshape", {F({}), I({1, -1})}},
      {"aten::_unsafe_view", {F({2, 3}), I({3, -1})}},
      {"aten::view_copy", {F({2, 3}), I({-1})}},
      {"aten::view_as", {F({2, 3}), F({3, 2})}},
      {"aten::reshape_as", {F({2, 3}), F({6})}},
      {"aten::_reshape_alias", {F({2, 3}), I({3, 2}), I({2, 1})}},
      {"aten::as_strided", {F({2, 3}), I({2, 2}), I({1, 2})}},
      {"aten::flatten.using_ints", {F({2, 3, 4})}},
      {"aten::flatten.using_ints", {F({2, 3, 4}), 1, -1}},
      {"aten::flatten.using_ints", {F({2, 3, 4}), 1, 1}},
      {"aten::flatten.using_ints", {F({})}},
      {"aten::unflatten.int", {F({2, 12}), 1, I({3, -1})}},
      {"aten::unflatten.int", {F({2, 12}), -1, I({2, 2, 3})}},
      {"aten::permute", {F({2, 3, 4}), I({2, 0, -2})}},
      {"aten::permute", {F({}), I({})}},
      {"aten::transpose.int", {F({2, 3, 4}), 0, -1}},
      {"aten::transpose.int", {F({}), 0, -1}},
      {"aten::transpose_", {F({2, 3}), 0, 1}},
      {"aten::swapaxes", {F({2, 3, 4}), 1, 2}},
      {"aten::swapdims", {F({2, 3, 4}), -1, 0}},
      {"aten::t", {F({2, 3})}},
      {"aten::t", {F({3})}},
      {"aten::t_", {F({2, 3})}},
      {"aten::movedim.int", {F({2, 3, 4}), 0, -1}},
      {"aten::movedim.intlist", {F({2, 3, 4, 5}), I({0, 1}), I({3, 0})}},
      {"aten::unsqueeze", {F({2, 3}), -1}},
      {"aten::unsqueeze", {F({2, 3}), 1}},
      {"aten::unsqueeze", {F({}), 0}},
      {"aten::unsqueeze_", {F({2, 3}), 0}},
      {"aten::squeeze", {F({1, 3, 1})}},
      {"aten::squeeze", {F({1, 0, 1})}},
      {"aten::squeeze.dim", {F({1, 3}), 0}},
      {"aten::squeeze.dim", {F({1, 3}), -1}},
      {"aten::squeeze.dim", {F({}), 0}},
      {"aten::squeeze_", {F({2, 1})}},
      {"aten::squeeze_.dim", {F({2, 1}), 1}},
      {"aten::expand", {F({3, 1}), I({2, -1, 4})}},
      {"aten::expand", {F({}), I({2, 3})}},
      {"aten::expand", {F({1}), I({0})}},
      {"aten::expand_copy", {F({3, 1}), I({3, 2})}},
      {"aten::expand_as", {F({1, 3}), F({2, 2, 3})}},
      {"aten::slice.Tensor", {F({5, 3}), 0, 1, 4, 2}},
      {"aten::slice.Tensor", {F({5, 3}), 1, None(), None(), 1}},
      {"aten::slice.Tensor", {F({5, 3}), 0, -2, None(), 1}},
      {"aten::slice.Tensor", {F({5, 3}), 0, -10, 100, 3}},
      {"aten::slice.Tensor", {F({5, 3}), -1, 2, 1, 1}},
      {"aten::slice.Tensor", {F({5, 3}), 0, 7, 9, 1}},
      {"aten::slice.Tensor", {F({5, 3}), 0, 0, -1, 2}},
      {"aten::slice.Tensor", {F({0, 3}), 0, 1, 2, 1}},
      {"aten::slice.Tensor", {F({5}), 0, std::numeric_limits<int64_t>::max(), None(), 1}},
      {"aten::select.int", {F({4, 3}), 1, -1}},
      {"aten::select.int", {F({4, 3}), 0, 3}},
      {"aten::narrow", {F({5, 3}), 0, 1, 3}},
      {"aten::narrow", {F({5, 3}), 0, -2, 2}},
      {"aten::narrow", {F({5, 3}), -1, 3, 0}},
      {"aten::narrow", {F({5, 3}), 0, 5, 0}},
      {"aten::narrow", {F({0, 3}), 0, 0, 0}},
      {"aten::narrow.Tensor", {F({5, 3}), 0, L({}, 2), 2}},
      {"aten::diagonal", {F({3, 4})}},
      {"aten::diagonal", {F({3, 4}), 1}},
      {"aten::diagonal", {F({3, 4}), -2}},
      {"aten::diagonal", {F({3, 4}), 9}},
      {"aten::diagonal", {F({2, 3, 4}), 0, 0, 2}},
  };
  cases.insert(cases.end(), more.begin(), more.end());
}

void AddJoinCases(std::vector<Case>& cases) {
  std::vector<Case> more = {
      {"aten::cat", {List({F({2, 3}), F({4, 3})}), 0}},
      {"aten::cat", {List({F({2, 3}), F({2, 1})}), -1}},
      {"aten::cat", {List({F({0}), F({2, 3}), F({0})}), 1}},
      {"aten::cat", {List({F({0}), F({0})})}},
      {"aten::cat", {List({F({2, 0}), F({2, 3})}), 1}},
      {"aten::concat", {List({F({2}), F({3})})}},
      {"aten::stack", {List({F({2, 3}), F({2, 3}), F({2, 3})}), 1}},
      {"aten::stack", {List({F({2, 3}), F({2, 3})}), -1}},
      {"aten::stack", {List({F({}), F({})})}},
      {"aten::split.Tensor", {F({5, 2}), 2}},
      {"aten::split.Tensor", {F({5, 2}), 2, 1}},
      {"aten::split.Tensor", {F({5, 2}), 7}},
      {"aten::split.Tensor", {F({0, 2}), 0}},
      {"aten::split.Tensor", {F({0, 2}), 3}},
      {"aten::unsafe_split.Tensor", {F({5, 2}), 3}},
      {"aten::split.sizes", {F({5, 2}), I({2, 3})}},
      {"aten::split_with_sizes", {F({5, 2}), I({1, 0, 1}), -1}},
      {"aten::unsafe_split_with_sizes", {F({5, 2}), I({4, 1})}},
      {"aten::chunk", {F({5, 2}), 3}},
      {"aten::chunk", {F({6, 2}), 3}},
      {"aten::chunk", {F({2, 2}), 5}},
      {"aten::chunk", {F({0, 2}), 3}},
      {"aten::chunk", {F({3, 2}), 2, -1}},
      {"aten::unsafe_chunk", {F({5, 2}), 2}},
      {"aten::unbind.int", {F({3, 2})}},
      {"aten::unbind.int", {F({3, 2}), -1}},
      {"aten::unbind.int", {F({0, 2})}},
  };
  cases.insert(cases.end(), more.begin(), more.end());
}

void AddIndexingCases(std::vector<Case>& cases) {
  std::vector<Case> more = {
      {"aten::index_select", {F({4, 3}), 0, L({5}, 4)}},
      {"aten::index_select", {F({4, 3}), -1, L({}, 3)}},
      {"aten::index_select", {F({}), 0, L({1}, 1)}},
      {"aten::gather", {F({4, 3}), 1, L({4, 2}, 3)}},
      {"aten::gather", {F({4, 3}), 0, L({2, 3}, 4)}},
      {"aten::embedding", {F({10, 4}), L({2, 5}, 10)}},
      {"aten::embedding", {F({10, 4}), L({}, 10)}},
      {"aten::embedding_renorm_", {F({10, 3}), L({4}, 10), 1.0, 2.0}},
      {"aten::repeat", {F({2, 3}), I({2, 1, 2})}},
      {"aten::repeat", {F({2, 3}), I({0, 1})}},
      {"aten::flip", {F({2, 3}), I({0, -1})}},
      {"aten::roll", {F({2, 3}), I({1}), I({0})}},
      {"aten::roll", {F({2, 3}), I({2})}},
      {"aten::roll", {F({2, 3}), I({1, -1}), I({0, 1})}},
      {"aten::tril", {F({3, 4})}},
      {"aten::triu", {F({2, 3, 4}), 1}},
      {"aten::tril_", {F({3, 3}), -1}},
      {"aten::triu_", {F({3, 3})}},
      {"aten::scatter.src", {F({3, 4}), 1, L({3, 2}, 4), F({3, 2})}},
      {"aten::scatter.value", {F({3, 4}), 0, L({2, 4}, 3), 1.0}},
      {"aten::scatter.reduce", {F({3, 4}), 1, L({3, 2}, 4), F({3, 2})}, {{"reduce", "add"}}},
      {"aten::scatter.value_reduce", {F({3, 4}), 1, L({3, 2}, 4), 2.0},
       {{"reduce", "multiply"}}},
      {"aten::scatter_.src", {F({3, 4}), 1, L({3, 2}, 4), F({3, 2})}},
      {"aten::scatter_.value", {F({3, 4}), -1, L({3, 2}, 4), 1.0}},
      {"aten::scatter_.reduce", {F({3, 4}), 1, L({3, 2}, 4), F({3, 2})}, {{"reduce", "add"}}},
      {"aten::scatter_.value_reduce", {F({3, 4}), 1, L({3, 2}, 4), 2.0}, {{"reduce", "add"}}},
      {"aten::scatter_add", {F({3, 4}), 1, L({3, 2}, 4), F({3, 2})}},
      {"aten::scatter_add_", {F({3, 4}), 0, L({2, 4}, 3), F({2, 4})}},
      {"aten::index_add", {F({4, 3}), 0, L({2}, 4), F({2, 3})}},
      {"aten::index_copy", {F({4, 3}), 0, L({2}, 4), F({2, 3})}},
      {"aten::index_fill.int_Scalar", {F({4, 3}), 1, L({2}, 3), 1.0}},
      {"aten::index_fill.int_Tensor", {F({4, 3}), 0, L({2}, 4), F({})}},
  };
  cases.insert(cases.end(), more.begin(), more.end());
}

void AddNormCases(std::vector<Case>& cases) {
  std::vector<Case> more = {
      {"aten::layer_norm", {F({2, 3, 4}), I({4}), F({4}), F({4})}},
      {"aten::layer_norm", {F({2, 3, 4}), I({3, 4})}},
      {"aten::native_layer_norm", {F({2, 3, 4}), I({3, 4}), F({3, 4}), F({3, 4}), 1e-5}},
      {"aten::native_layer_norm", {F({5, 4}), I({4}), None(), None(), 1e-5}},
      {"aten::native_layer_norm", {F({4}), I({4}), None(), None(), 1e-5}},
      {"aten::group_norm", {F({2, 6, 4}), 3, F({6}), F({6})}},
      {"aten::group_norm", {F({2, 6}), 2}},
      {"aten::native_group_norm", {F({2, 6, 4}), F({6}), F({6}), 2, 6, 4, 3, 1e-5}},
      {"aten::native_group_norm", {F({2, 6, 2, 2}), None(), None(), 2, 6, 4, 2, 1e-5}},
      {"aten::batch_norm", {F({4, 3, 5}), F({3}), F({3}), F({3}), F({3}), false, 0.1, 1e-5, false}},
      {"aten::batch_norm", {F({4, 3}), None(), None(), None(), None(), true, 0.1, 1e-5, false}},
      {"aten::native_batch_norm", {F({4, 3, 5}), F({3}), F({3}), F({3}), F({3}), true, 0.1, 1e-5}},
      {"aten::native_batch_norm", {F({4, 3, 5}), F({3}), F({3}), F({3}), F({3}), false, 0.1, 1e-5}},
      {"aten::native_batch_norm", {F({4, 3}), None(), None(), None(), None(), true, 0.1, 1e-5}},
      {"aten::instance_norm",
       {F({2, 3, 5}), None(), None(), None(), None(), true, 0.1, 1e-5, false}},
  };
  cases.insert(cases.end(), more.begin(), more.end());
}

void AddFactoryCases(std::vector<Case>& cases) {
  for (const char* op : {"aten::zeros", "aten::ones", "aten::empty.memory_format", "aten::rand",
                         "aten::randn", "aten::rand.generator", "aten::randn.generator"}) {
    cases.push_back({op, {I({2, 3})}});
    cases.push_back({op, {I({})}});
    cases.push_back({op, {I({0, 4})}});
  }
  for (const char* op : {"aten::zeros_like", "aten::ones_like", "aten::empty_like",
                         "aten::rand_like", "aten::randn_like", "aten::normal.Tensor_float",
                         "aten::bernoulli", "aten::poisson", "aten::normal_", "aten::uniform_",
                         "aten::bernoulli_.float", "aten::random_", "aten::exponential_",
                         "aten::cauchy_", "aten::log_normal_"}) {
    cases.push_back({op, {F({2, 3})}});
    cases.push_back({op, {F({})}});
  }
  std::vector<Case> more = {
      {"aten::full", {I({2, 3}), 1.5}},
      {"aten::empty_strided", {I({2, 3}), I({3, 1})}},
      {"aten::new_zeros", {F({1}), I({2, 3})}},
      {"aten::new_ones", {F({1}), I({4})}},
      {"aten::new_empty", {F({1}), I({})}},
      {"aten::new_full", {F({1}), I({2}), 2.0}},
      {"aten::randint", {5, I({2, 3})}},
      {"aten::randint.generator", {5, I({2}), None()}},
      {"aten::randint.low", {1, 5, I({3})}},
      {"aten::randint.low_generator", {-3, 5, I({3, 1}), None()}},
      {"aten::randperm", {7}},
      {"aten::randperm.generator", {0, None()}},
      {"aten::arange", {5}},
      {"aten::arange", {5.5}},
      {"aten::arange", {0}},
      {"aten::arange.start", {2, 7}},
      {"aten::arange.start", {0, 2.5}},
      {"aten::arange.start", {0, 2.5}, {{"dtype", c10::ScalarType::Long}}},
      {"aten::arange.start", {0, 2.5}, {{"dtype", c10::ScalarType::Int}}},
      {"aten::arange.start", {0.5, 2.7}, {{"dtype", c10::ScalarType::Long}}},
      {"aten::arange.start_step", {0, 10, 3}},
      {"aten::arange.start_step", {1.0, 0.0, -0.3}},
      {"aten::arange.start_step", {0, 1, 0.1}},
      {"aten::arange.start_step", {0, 5, 2}, {{"dtype", c10::ScalarType::Float}}},
      {"aten::arange.start_step", {10, 0, -3}},
      {"aten::arange.start_step", {0.5, 5.5, 1.5}, {{"dtype", c10::ScalarType::Long}}},
      {"aten::linspace", {0.0, 1.0, 5}},
      {"aten::linspace", {0.0, 1.0, 0}},
      {"aten::logspace", {0.0, 1.0, 3}},
      {"aten::eye", {3}},
      {"aten::eye.m", {2, 4}},
      {"aten::eye.m", {0, 4}},
      {"aten::full_like", {F({2, 3}), 2.0}},
      {"aten::randint_like", {F({2, 3}), 5}},
      {"aten::randint_like.low_dtype", {F({2, 3}), 1, 5}},
      {"aten::scalar_tensor", {2.5}},
      {"aten::normal.float_Tensor", {0.0, F({2, 3})}},
      {"aten::normal.float_float", {0.0, 1.0, I({2, 3})}},
      {"aten::bernoulli.p", {F({2, 3}), 0.5}},
      {"aten::bernoulli.Tensor", {F({2, 3}), F({3})}},
      {"aten::random_.from", {F({2, 3}), 0, 10}},
      {"aten::random_.to", {F({2, 3}), 10}},
      {"aten::geometric_", {F({2, 3}), 0.5}},
      {"aten::multinomial", {F({5}), 3}},
      {"aten::multinomial", {F({2, 5}), 7, true}},
      {"aten::nonzero", {F({2, 3})}},
      {"aten::nonzero", {F({})}},
      {"aten::argwhere", {F({2, 3, 4})}},
      {"aten::masked_select", {F({2, 3}), B({3})}},
      {"aten::masked_select", {F({3}), B({2, 1})}},
  };
  cases.insert(cases.end(), more.begin(), more.end());
}

// Convolutions, pooling, recurrent layers, losses and attention (ops/conv.cc, ops/rnn.cc).
void AddLayerCases(std::vector<Case>& cases) {
  const std::vector<Case> more = {
      {"aten::conv1d", {F({2, 4, 9}), F({6, 4, 3}), F({6})}},
      {"aten::conv1d", {F({4, 9}), F({6, 2, 3}), None(), I({2}), I({1}), I({2}), 2}},
      {"aten::conv2d", {F({2, 3, 8, 7}), F({5, 3, 3, 3})}},
      {"aten::conv2d", {F({2, 4, 9, 10}), F({6, 2, 3, 2}), F({6}), I({2, 3}), I({1, 0}), I({1, 2}), 2}},
      {"aten::conv2d", {F({3, 8, 8}), F({4, 3, 5, 5}), None(), I({3}), I({2})}},
      {"aten::conv3d", {F({1, 2, 5, 6, 7}), F({3, 2, 2, 3, 2}), None(), I({1, 2, 1})}},
      {"aten::conv_transpose1d", {F({2, 4, 5}), F({4, 3, 3})}},
      {"aten::conv_transpose2d.input", {F({2, 4, 5, 6}), F({4, 3, 4, 4}), F({6}), I({2}), I({1}), I({1}), 2}},
      {"aten::conv_transpose2d.input", {F({4, 5, 6}), F({4, 3, 3, 3}), None(), I({2, 1}), I({0}), I({1, 0}), 1, I({2})}},
      {"aten::conv_transpose3d.input", {F({1, 2, 3, 4, 5}), F({2, 2, 2, 2, 2})}},
      {"aten::convolution", {F({2, 3, 8, 8}), F({4, 3, 3, 3}), F({4}), I({2, 2}), I({1, 1}), I({1, 1}), false, I({0, 0}), 1}},
      {"aten::convolution", {F({2, 4, 5, 5}), F({4, 2, 3, 3}), None(), I({2, 2}), I({1, 1}), I({1, 1}), true, I({1, 1}), 1}},
      {"aten::_convolution", {F({2, 3, 8, 8}), F({4, 3, 3, 3}), None(), I({1, 1}), I({0, 0}), I({2, 2}), false, I({0, 0}), 1, false, false, true, true}},
      {"aten::max_pool1d", {F({2, 3, 9}), I({3})}},
      {"aten::max_pool2d", {F({2, 3, 9, 8}), I({2, 2})}},
      {"aten::max_pool2d", {F({3, 9, 8}), I({3}), I({2}), I({1}), I({2}), true}},
      {"aten::max_pool2d", {F({2, 3, 7, 7}), I({3, 2}), I({2, 2}), I({1, 0}), I({1}), true}},
      {"aten::max_pool3d", {F({1, 2, 5, 6, 7}), I({2}), I({}), I({1})}},
      {"aten::max_pool2d_with_indices", {F({2, 3, 9, 8}), I({2}), I({1})}},
      {"aten::max_pool1d_with_indices", {F({2, 3, 9}), I({3}), I({2})}},
      {"aten::max_pool3d_with_indices", {F({1, 2, 5, 6, 7}), I({2})}},
      {"aten::avg_pool1d", {F({2, 3, 9}), I({3}), I({2}), I({1})}},
      {"aten::avg_pool2d", {F({2, 3, 9, 8}), I({2, 3})}},
      {"aten::avg_pool2d", {F({3, 10, 8}), I({3}), I({2}), I({1}), true}},
      {"aten::avg_pool3d", {F({1, 2, 5, 6, 7}), I({2}), I({1}), I({0}), true}},
      {"aten::adaptive_avg_pool1d", {F({2, 3, 9}), I({4})}},
      {"aten::adaptive_avg_pool2d", {F({2, 3, 9, 8}), I({1, 1})}},
      {"aten::adaptive_avg_pool2d", {F({3, 9, 8}), I({4, 3})}},
      {"aten::adaptive_avg_pool3d", {F({1, 2, 5, 6, 7}), I({2, 2, 2})}},
      {"aten::_adaptive_avg_pool2d", {F({2, 3, 9, 8}), I({2, 2})}},
      {"aten::_adaptive_avg_pool3d", {F({1, 2, 5, 6, 7}), I({2, 1, 3})}},
      {"aten::adaptive_max_pool1d", {F({2, 3, 9}), I({4})}},
      {"aten::adaptive_max_pool2d", {F({2, 3, 9, 8}), I({3, 2})}},
      {"aten::adaptive_max_pool3d", {F({2, 5, 6, 7}), I({2, 3, 1})}},
      // lstm(input [T, B, I], hx [L*D, B, H] x2, params per layer and direction, has_biases,
      // num_layers, dropout, train, bidirectional, batch_first)
      {"aten::lstm.input", {F({5, 2, 3}), List({F({1, 2, 4}), F({1, 2, 4})}),
                            List({F({16, 3}), F({16, 4}), F({16}), F({16})}), true, 1, 0.0, false, false, false}},
      {"aten::lstm.input", {F({2, 5, 3}), List({F({2, 2, 4}), F({2, 2, 4})}),
                            List({F({16, 3}), F({16, 4}), F({16, 3}), F({16, 4})}), false, 1, 0.0, false, true, true}},
      {"aten::gru.input", {F({5, 2, 3}), F({2, 2, 4}),
                           List({F({12, 3}), F({12, 4}), F({12}), F({12}), F({12, 4}), F({12, 4}), F({12}), F({12})}),
                           true, 2, 0.0, false, false, false}},
      {"aten::rnn_tanh.input", {F({2, 5, 3}), F({1, 2, 4}), List({F({4, 3}), F({4, 4})}), false, 1, 0.0, false, false, true}},
      {"aten::rnn_relu.input", {F({5, 2, 3}), F({1, 2, 4}), List({F({4, 3}), F({4, 4})}), false, 1, 0.0, false, false, false}},
      {"aten::lstm_cell", {F({2, 3}), List({F({2, 4}), F({2, 4})}), F({16, 3}), F({16, 4}), F({16}), F({16})}},
      {"aten::gru_cell", {F({2, 3}), F({2, 4}), F({12, 3}), F({12, 4}), F({12}), F({12})}},
      {"aten::rnn_tanh_cell", {F({2, 3}), F({2, 4}), F({4, 3}), F({4, 4})}},
      {"aten::rnn_relu_cell", {F({1, 3}), F({1, 4}), F({4, 3}), F({4, 4})}},
      {"aten::mse_loss", {F({2, 3}), F({2, 3})}},
      {"aten::mse_loss", {F({2, 3}), F({2, 3}), 0}},
      {"aten::l1_loss", {F({4}), F({4}), 0}},
      {"aten::smooth_l1_loss", {F({2, 3}), F({2, 3}), 2}},
      {"aten::huber_loss", {F({2, 3}), F({2, 3}), 0}},
      {"aten::soft_margin_loss", {F({2, 3}), F({2, 3}), 0}},
      {"aten::binary_cross_entropy", {F({2, 3}), F({2, 3})}},
      {"aten::binary_cross_entropy", {F({2, 3}), F({2, 3}), F({3}), 0}},
      {"aten::binary_cross_entropy_with_logits", {F({2, 3}), F({2, 3}), None(), None(), 0}},
      {"aten::nll_loss", {F({4, 3}), L({4}, 3)}},
      {"aten::nll_loss", {F({4, 3}), L({4}, 3), F({3}), 0}},
      {"aten::nll_loss", {F({3}), L({}, 3), None(), 0}},
      {"aten::nll_loss_nd", {F({2, 3, 4, 5}), L({2, 4, 5}, 3), None(), 0}},
      {"aten::nll_loss2d", {F({2, 3, 4, 5}), L({2, 4, 5}, 3)}},
      {"aten::nll_loss_forward", {F({4, 3}), L({4}, 3), None(), 0, -100}},
      {"aten::nll_loss2d_forward", {F({2, 3, 4, 5}), L({2, 4, 5}, 3), None(), 1, -100}},
      {"aten::cross_entropy_loss", {F({4, 3}), L({4}, 3)}},
      {"aten::cross_entropy_loss", {F({4, 3, 2}), L({4, 2}, 3), None(), 0}},
      {"aten::cross_entropy_loss", {F({4, 3}), F({4, 3}), None(), 0}},
      {"aten::cross_entropy_loss", {F({3}), L({}, 3), F({3}), 0}},
      {"aten::scaled_dot_product_attention", {F({2, 3, 5, 4}), F({2, 3, 6, 4}), F({2, 3, 6, 7})}},
      {"aten::scaled_dot_product_attention", {F({5, 4}), F({6, 4}), F({6, 2}), B({5, 6})}},
  };
  cases.insert(cases.end(), more.begin(), more.end());
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  AddUnaryCases(cases);
  AddBinaryCases(cases);
  AddReductionCases(cases);
  AddLinalgCases(cases);
  AddViewCases(cases);
  AddJoinCases(cases);
  AddIndexingCases(cases);
  AddNormCases(cases);
  AddFactoryCases(cases);
  AddLayerCases(cases);
  // Cases of ops this LibTorch does not have (Registry::Absent) are not run.
  cases.erase(std::remove_if(cases.begin(), cases.end(),
                             [](const Case& c) {
                               const auto [name, overload] = SplitName(c.op);
                               return !c10::Dispatcher::singleton().findSchema({name, overload}).has_value();
                             }),
              cases.end());
  return cases;
}

// Calls that eager LibTorch rejects because of their shapes.
std::vector<Case> InvalidCases() {
  return {
      {"aten::conv2d", {F({2, 4, 8, 8}), F({5, 3, 3, 3})}},
      {"aten::conv2d", {F({2, 3, 2, 8}), F({5, 3, 3, 3})}},
      {"aten::conv2d", {F({2, 3, 8}), F({5, 3, 3, 3}), None(), I({1}), I({0}), I({1}), 1}},
      {"aten::conv2d", {F({2, 3, 8, 8}), F({5, 3, 3, 3}), F({4})}},
      {"aten::conv_transpose2d.input", {F({2, 3, 5, 5}), F({4, 3, 3, 3})}},
      {"aten::adaptive_avg_pool2d", {F({2, 3, 4, 4}), I({2})}},
      {"aten::max_pool2d", {F({2, 3, 2, 2}), I({3})}},
      {"aten::max_pool2d", {F({2, 3, 8, 8}), I({2}), I({2}), I({2})}},
      {"aten::adaptive_avg_pool2d", {F({2, 3, 0, 4}), I({2, 2})}},
      {"aten::lstm_cell", {F({2, 5}), List({F({2, 4}), F({2, 4})}), F({16, 3}), F({16, 4})}},
      {"aten::gru_cell", {F({2, 3}), F({3, 4}), F({12, 3}), F({12, 4})}},
      {"aten::nll_loss", {F({4, 3}), L({5}, 3)}},
      {"aten::binary_cross_entropy", {F({2, 3}), F({3, 2})}},
      {"aten::cross_entropy_loss", {F({4, 3}), L({4, 2}, 3)}},
      {"aten::add.Tensor", {F({3}), F({4})}},
      {"aten::add_.Tensor", {F({1}), F({3})}},
      {"aten::mul_.Tensor", {F({3}), F({2, 3})}},
      {"aten::where.self", {B({2}), F({3}), F({1})}},
      {"aten::masked_fill.Tensor", {F({2, 3}), B({3}), F({1})}},
      {"aten::copy_", {F({2, 3}), F({4})}},
      {"aten::mm", {F({2, 3}), F({4, 5})}},
      {"aten::mm", {F({2, 3}), F({3})}},
      {"aten::matmul", {F({2, 3}), F({4})}},
      {"aten::matmul", {F({}), F({3})}},
      {"aten::matmul", {F({2, 2, 3}), F({3, 3, 4})}},
      {"aten::bmm", {F({2, 2, 3}), F({3, 3, 4})}},
      {"aten::dot", {F({3}), F({4})}},
      {"aten::linear", {F({2, 3}), F({4, 5})}},
      {"aten::linear", {F({2, 3}), F({4, 3}), F({5})}},
      {"aten::addmm", {F({3, 4}), F({2, 3}), F({3, 4})}},
      {"aten::reshape", {F({2, 3}), I({4})}},
      {"aten::view", {F({2, 3}), I({-1, 4})}},
      {"aten::reshape", {F({2, 3}), I({-1, -1})}},
      {"aten::reshape", {F({0, 3}), I({0, -1})}},
      {"aten::unflatten.int", {F({2, 12}), 1, I({5, -1})}},
      {"aten::flatten.using_ints", {F({2, 3, 4}), 2, 1}},
      {"aten::permute", {F({2, 3}), I({0})}},
      {"aten::permute", {F({2, 3}), I({0, 0})}},
      {"aten::transpose.int", {F({2, 3}), 0, 2}},
      {"aten::t", {F({2, 3, 4})}},
      {"aten::unsqueeze", {F({2, 3}), 3}},
      {"aten::expand", {F({2, 3}), I({4, 3})}},
      {"aten::expand", {F({2, 3}), I({3})}},
      {"aten::expand", {F({3}), I({-1, 3})}},
      {"aten::slice.Tensor", {F({}), 0, 0, 1, 1}},
      {"aten::slice.Tensor", {F({4}), 0, 0, 1, 0}},
      {"aten::select.int", {F({4, 3}), 0, 4}},
      {"aten::select.int", {F({4, 3}), 1, -4}},
      {"aten::narrow", {F({5, 3}), 0, 3, 3}},
      {"aten::diagonal", {F({3, 4}), 0, 1, 1}},
      {"aten::cat", {List({F({2, 3}), F({2, 3, 1})})}},
      {"aten::cat", {List({F({2, 3}), F({2, 4})})}},
      {"aten::cat", {List({F({}), F({})})}},
      {"aten::stack", {List({F({2, 3}), F({3, 2})})}},
      {"aten::split_with_sizes", {F({5, 2}), I({2, 2})}},
      {"aten::split.Tensor", {F({5, 2}), 0}},
      {"aten::chunk", {F({5, 2}), 0}},
      {"aten::unbind.int", {F({})}},
      {"aten::sum.dim_IntList", {F({2, 3}), I({2})}},
      {"aten::sum.dim_IntList", {F({2, 3}), I({1, -1})}},
      {"aten::max.dim", {F({2, 3}), -3}},
      {"aten::logsumexp", {F({2, 3}), I({})}},  // Note [logsumexp of dim=[]]
      {"aten::softmax.int", {F({2, 3}), 2}},
      {"aten::layer_norm", {F({2, 3, 4}), I({3})}},
      {"aten::layer_norm", {F({2, 3, 4}), I({4}), F({3})}},
      {"aten::group_norm", {F({2, 6, 4}), 4}},
      {"aten::batch_norm", {F({4, 3}), F({4}), None(), F({3}), F({3}), false, 0.1, 1e-5, false}},
      {"aten::batch_norm", {F({4, 3}), None(), None(), None(), None(), false, 0.1, 1e-5, false}},
      {"aten::index_select", {F({4, 3}), 0, L({2, 2})}},
      {"aten::gather", {F({4, 3}), 1, L({4})}},
      {"aten::gather", {F({4, 3}), 1, L({5, 3})}},
      {"aten::embedding", {F({10}), L({2})}},
      {"aten::repeat", {F({2, 3}), I({2})}},
      {"aten::flip", {F({2, 3}), I({0, -2})}},
      {"aten::roll", {F({2, 3}), I({1, 1}), I({0})}},
      {"aten::tril", {F({3})}},
      {"aten::zeros", {I({2, -1})}},
      {"aten::arange.start_step", {0, 5, 0}},
      {"aten::arange.start_step", {0, 5, -1}},
      {"aten::arange.start_step", {0, 2.5, 0.5}, {{"dtype", c10::ScalarType::Long}}},
      {"aten::eye", {-1}},
      {"aten::randint", {0, I({2})}},
      {"aten::multinomial", {F({3}), 4}},
      {"aten::multinomial", {F({2, 2, 3}), 1}},
      {"aten::masked_select", {F({3}), B({4})}},
      {"aten::fill_.Tensor", {F({2, 3}), F({1})}},
  };
}

// --- Tests ----------------------------------------------------------------------------------

TEST(RegistryTest, RulesMatchEagerShapes) {
  const std::vector<Case> cases = AllCases();
  int checked = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(Describe(c));
    const OpInfo* info = Registry::Global().Find(c.op);
    ASSERT_NE(info, nullptr) << "no rule registered for " << c.op;
    std::vector<c10::IValue> stack = FullStack(c);
    // The context is built before the call: in-place ops (t_, squeeze_) change self's shape.
    const ShapeContext ctx = ToContext(c.op, stack);
    try {
      Handle(c.op).callBoxed(stack);
    } catch (const c10::Error& e) {
      ADD_FAILURE() << "eager call failed: " << e.what_without_backtrace();
      continue;
    }
    const std::vector<Shape> real = RealShapes(stack);
    absl::StatusOr<std::vector<Shape>> rule = info->shape(ctx);
    ASSERT_TRUE(rule.ok()) << rule.status();
    EXPECT_TRUE(Matches(*rule, real)) << "rule: " << ToString(*rule) << " real: " << ToString(real);
    ++checked;
  }
  EXPECT_GT(checked, 500);
}

TEST(RegistryTest, InvalidShapesFailInBothEagerAndRule) {
  for (const Case& c : InvalidCases()) {
    SCOPED_TRACE(Describe(c));
    const OpInfo* info = Registry::Global().Find(c.op);
    ASSERT_NE(info, nullptr);
    std::vector<c10::IValue> stack = FullStack(c);
    const ShapeContext ctx = ToContext(c.op, stack);
    EXPECT_ANY_THROW(Handle(c.op).callBoxed(stack)) << "the case is not invalid";
    absl::StatusOr<std::vector<Shape>> rule = info->shape(ctx);
    ASSERT_FALSE(rule.ok()) << "rule accepted it: " << ToString(*rule);
    EXPECT_TRUE(absl::IsInvalidArgument(rule.status())) << rule.status();
    EXPECT_THAT(std::string(rule.status().message()), HasSubstr(c.op + ": "));
  }
}

absl::Status RuleError(const Case& c) {
  std::vector<c10::IValue> stack = FullStack(c);
  return Registry::Global().Find(c.op)->shape(ToContext(c.op, stack)).status();
}

TEST(RegistryTest, ErrorMessagesNameTheRequirement) {
  EXPECT_EQ(RuleError({"aten::add.Tensor", {F({3}), F({4})}}).message(),
            "aten::add.Tensor: broadcast requires 3 == 4");
  EXPECT_EQ(RuleError({"aten::mm", {F({2, 3}), F({4, 5})}}).message(),
            "aten::mm: mm inner dims requires 3 == 4");
  EXPECT_EQ(RuleError({"aten::reshape", {F({2, 3}), I({4})}}).message(),
            "aten::reshape: reshape keeps the number of elements requires 4 == 6");
  EXPECT_THAT(std::string(RuleError({"aten::add_.Tensor", {F({1}), F({3})}}).message()),
              HasSubstr("in-place broadcast"));
  EXPECT_THAT(std::string(RuleError({"aten::sum.dim_IntList", {F({2}), I({1})}}).message()),
              HasSubstr("dim 1 out of range for rank 1"));
}

TEST(RegistryTest, RulesForOpsThisLibTorchLacksAreNotRegistered) {
  for (const std::string& op : Registry::Global().Absent()) {
    EXPECT_EQ(Registry::Global().Find(op), nullptr) << op;
    const auto [name, overload] = SplitName(op);
    EXPECT_FALSE(c10::Dispatcher::singleton().findSchema({name, overload}).has_value()) << op;
  }
  // aten::frobenius_norm (no overload) left LibTorch in 2.0; 1.13 has it.
  const bool has = c10::Dispatcher::singleton().findSchema({"aten::frobenius_norm", ""}).has_value();
  EXPECT_EQ(Registry::Global().Find("aten::frobenius_norm") != nullptr, has);
}

TEST(RegistryTest, EveryRegisteredNameIsARealSchema) {
  const std::vector<std::string> names = Registry::Global().Names();
  EXPECT_GT(names.size(), 400u);
  for (const std::string& op : names) {
    const auto [name, overload] = SplitName(op);
    EXPECT_TRUE(c10::Dispatcher::singleton().findSchema({name, overload}).has_value())
        << op << " is not an operator of this LibTorch";
  }
}

TEST(RegistryTest, MostRegisteredOpsHaveADifferentialCase) {
  std::set<std::string> covered;
  for (const Case& c : AllCases()) covered.insert(c.op);
  std::vector<std::string> uncovered;
  const std::vector<std::string> names = Registry::Global().Names();
  for (const std::string& op : names) {
    if (!covered.count(op)) uncovered.push_back(op);
  }
  const double coverage = 1.0 - static_cast<double>(uncovered.size()) / names.size();
  EXPECT_GE(coverage, 0.95) << "uncovered: " << ::testing::PrintToString(uncovered);
}

TEST(RegistryTest, FlagsMarkRandomFactoryAndDataDependentOps) {
  const Registry& r = Registry::Global();
  EXPECT_TRUE(r.Find("aten::randn")->random);
  EXPECT_TRUE(r.Find("aten::randn")->factory);
  EXPECT_TRUE(r.Find("aten::zeros")->factory);
  EXPECT_FALSE(r.Find("aten::zeros")->random);
  EXPECT_TRUE(r.Find("aten::dropout")->random);
  EXPECT_FALSE(r.Find("aten::dropout")->factory);
  EXPECT_TRUE(r.Find("aten::bernoulli")->random);
  EXPECT_TRUE(r.Find("aten::nonzero")->data_dependent_shape);
  EXPECT_TRUE(r.Find("aten::masked_select")->data_dependent_shape);
  EXPECT_FALSE(r.Find("aten::add.Tensor")->random);
  EXPECT_FALSE(r.Find("aten::add.Tensor")->data_dependent_shape);
  EXPECT_EQ(r.Find("aten::index.Tensor"), nullptr);  // Note [No rule for index.Tensor]
}

}  // namespace
}  // namespace warden::ops
