// Tests of guards/guard.cc: the reason texts of ../shared/API.md (exactly), the Describe() texts
// used by guards(entry)/explain()/WARDEN_LOGS=guards, Actual()/Holds() reference semantics and
// SameDouble.
#include "guards/guard.h"
#include "tests/guards/guard_test_util.h"

#include <cmath>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace warden::guards {
namespace {

// lhs == rhs over the sizes listed in `symbols` (symbol k is args[symbols[k].first].size(...)).
Guard Relation(std::vector<std::pair<int, int>> symbols, tracer::SymExpr lhs, tracer::SymExpr rhs,
               std::string why) {
  Guard g = Make(GuardKind::kSizeRelation, symbols.empty() ? -1 : symbols[0].first);
  g.dim = symbols.empty() ? -1 : symbols[0].second;
  g.symbols = std::move(symbols);
  g.lhs = std::move(lhs);
  g.rhs = std::move(rhs);
  g.provenance = std::move(why);
  return g;
}

tracer::SymExpr S(int k) { return tracer::SymExpr::Symbol(k); }

int64_t Dtype(at::ScalarType t) { return static_cast<int64_t>(t); }

// The device code a kDevice guard stores, as Actual() reads it from a tensor on that device.
int64_t DeviceCodeOf(const at::Tensor& t) { return Actual(Make(GuardKind::kDevice, 0), {t}); }

const std::vector<std::string> kNames = {"arg0", "arg1", "arg2"};

// --- Reason texts of API.md ---------------------------------------------------------------------

TEST(ReasonText, SizeMismatch) {
  EXPECT_EQ(FailureReason(Make(GuardKind::kSize, 0, 3, /*dim=*/0), {torch::zeros({4, 2})}, kNames),
            "tensor 'arg0' size mismatch at index 0. expected 3, actual 4");
}

TEST(ReasonText, StrideMismatch) {
  const at::Tensor t = torch::zeros({4, 3}).t();  // sizes [3, 4], strides [1, 3]
  EXPECT_EQ(FailureReason(Make(GuardKind::kStride, 0, 1, /*dim=*/1), {t}, kNames),
            "tensor 'arg0' stride mismatch at index 1. expected 1, actual 3");
}

TEST(ReasonText, RankMismatch) {
  EXPECT_EQ(FailureReason(Make(GuardKind::kRank, 0, 2), {torch::zeros({1, 2, 3})}, kNames),
            "tensor 'arg0' rank mismatch. expected 2, actual 3");
}

TEST(ReasonText, DtypeMismatch) {
  EXPECT_EQ(FailureReason(Make(GuardKind::kDtype, 0, Dtype(at::kFloat)),
                          {torch::zeros({2}, torch::kDouble)}, kNames),
            "tensor 'arg0' dtype mismatch. expected Float, actual Double");
}

TEST(ReasonText, DeviceMismatch) {
  const int64_t cpu = DeviceCodeOf(torch::zeros({1}));
  const at::Tensor meta = torch::empty({2}, torch::TensorOptions().device(torch::kMeta));
  EXPECT_EQ(FailureReason(Make(GuardKind::kDevice, 0, cpu), {meta}, kNames),
            "tensor 'arg0' device mismatch. expected cpu, actual meta");
}

TEST(ReasonText, TypeMismatch) {
  const Guard g = Make(GuardKind::kArgType, 1, static_cast<int64_t>(ArgType::kTensor));
  EXPECT_EQ(FailureReason(g, {torch::zeros({1}), int64_t{3}}, kNames),
            "expected type of 'arg1' to be Tensor, but found Int");
  EXPECT_EQ(FailureReason(g, {torch::zeros({1}), 2.5}, kNames),
            "expected type of 'arg1' to be Tensor, but found Double");
  EXPECT_EQ(FailureReason(g, {torch::zeros({1}), at::Tensor()}, kNames),
            "expected type of 'arg1' to be Tensor, but found UndefinedTensor");
  // Types the tracer does not accept are named by their IValue tag.
  EXPECT_EQ(FailureReason(g, {torch::zeros({1}), c10::IValue(std::string("s"))}, kNames),
            "expected type of 'arg1' to be Tensor, but found String");
  const Guard want_int = Make(GuardKind::kArgType, 0, static_cast<int64_t>(ArgType::kInt));
  EXPECT_EQ(FailureReason(want_int, {true}, kNames),
            "expected type of 'arg0' to be Int, but found Bool");
}

TEST(ReasonText, ScalarValueMismatch) {
  EXPECT_EQ(FailureReason(Make(GuardKind::kIntValue, 1, 3), {torch::zeros({1}), int64_t{4}}, kNames),
            "scalar 'arg1' value mismatch. expected 3, actual 4");
}

TEST(ReasonText, SizeRelationMismatch) {
  const Guard g = Relation({{0, 0}, {1, 0}}, S(0), S(1), "required by aten::add.Tensor at %3");
  EXPECT_EQ(FailureReason(g, {torch::zeros({4}), torch::zeros({5})}, kNames),
            "arg0.size(0) == arg1.size(0) failed: 4 vs 5 (required by aten::add.Tensor at %3)");
  EXPECT_EQ(FailureReason(g, {torch::zeros({5}), torch::zeros({5})}, kNames), "");
}

TEST(ReasonText, SizeRelationOverAnExpression) {
  // z.size(0) == x.size(0) + y.size(0), as cat followed by add requires.
  const Guard g = Relation({{2, 0}, {0, 0}, {1, 0}}, S(0), S(1) + S(2),
                           "required by aten::add.Tensor at %1");
  const Args args{torch::zeros({3, 1}), torch::zeros({5, 1}), torch::zeros({9, 1})};
  EXPECT_EQ(FailureReason(g, args, kNames),
            "arg2.size(0) == arg0.size(0) + arg1.size(0) failed: 9 vs 8 (required by "
            "aten::add.Tensor at %1)");
}

TEST(ReasonText, SizeAtLeast) {
  const Guard g = Make(GuardKind::kSizeAtLeast, 0, 2, /*dim=*/0);
  EXPECT_EQ(FailureReason(g, {torch::zeros({1, 3})}, kNames), "arg0.size(0) >= 2 failed: actual 1");
  EXPECT_EQ(FailureReason(g, {torch::zeros({0, 3})}, kNames), "arg0.size(0) >= 2 failed: actual 0");
  EXPECT_EQ(FailureReason(g, {torch::zeros({2, 3})}, kNames), "");
  EXPECT_EQ(FailureReason(g, {torch::zeros({200, 3})}, kNames), "");
}

// --- Reason texts of the other guard kinds --------------------------------------------------------

TEST(ReasonText, OtherKinds) {
  const at::Tensor t = torch::zeros({2});
  EXPECT_EQ(FailureReason(Make(GuardKind::kGradMode, -1, 0), {}, kNames),
            "grad mode mismatch. expected disabled, actual enabled");
  EXPECT_EQ(FailureReason(Make(GuardKind::kInferenceMode, -1, 1), {}, kNames),
            "inference mode mismatch. expected enabled, actual disabled");
  EXPECT_EQ(FailureReason(Make(GuardKind::kDefaultDtype, -1, Dtype(at::kDouble)), {}, kNames),
            "default dtype mismatch. expected Double, actual Float");
  EXPECT_EQ(FailureReason(Make(GuardKind::kArgCount, -1, 2), {t}, kNames),
            "argument count mismatch. expected 2, actual 1");
  EXPECT_EQ(FailureReason(Make(GuardKind::kLayout, 0, static_cast<int64_t>(c10::kStrided)),
                          {t.to_sparse()}, kNames),
            "tensor 'arg0' layout mismatch. expected Strided, actual Sparse");
  EXPECT_EQ(FailureReason(Make(GuardKind::kRequiresGrad, 0, 0),
                          {torch::zeros({2}, torch::requires_grad())}, kNames),
            "tensor 'arg0' requires_grad mismatch. expected false, actual true");
  EXPECT_EQ(FailureReason(DoubleGuard(0, 0.5), {0.25}, kNames),
            "scalar 'arg0' value mismatch. expected 0.5, actual 0.25");
  EXPECT_EQ(FailureReason(DoubleGuard(0, 0.0), {-0.0}, kNames),
            "scalar 'arg0' value mismatch. expected 0, actual -0.0");
  EXPECT_EQ(FailureReason(DoubleGuard(0, std::nan("")), {1.0}, kNames),
            "scalar 'arg0' value mismatch. expected nan, actual 1");
  EXPECT_EQ(FailureReason(Make(GuardKind::kBoolValue, 0, 1), {false}, kNames),
            "scalar 'arg0' value mismatch. expected true, actual false");
  EXPECT_EQ(FailureReason(Make(GuardKind::kAliasing, 0, 0, -1, /*other_arg=*/1), {t, t}, kNames),
            "tensor 'arg0' aliasing mismatch with 'arg1'. expected distinct storage, actual shared "
            "storage");
  EXPECT_EQ(FailureReason(Make(GuardKind::kAliasing, 0, 1, -1, /*other_arg=*/1),
                          {t, torch::zeros({2})}, kNames),
            "tensor 'arg0' aliasing mismatch with 'arg1'. expected shared storage, actual distinct "
            "storage");
}

TEST(ReasonText, UsesTheGivenArgumentNamesAndFallsBackToArgN) {
  const Guard g = Make(GuardKind::kSize, 2, 5, /*dim=*/1);
  const Args args{int64_t{0}, int64_t{0}, torch::zeros({1, 6})};
  EXPECT_EQ(FailureReason(g, args, {"x", "y", "weight"}),
            "tensor 'weight' size mismatch at index 1. expected 5, actual 6");
  EXPECT_EQ(FailureReason(g, args, {"x"}),
            "tensor 'arg2' size mismatch at index 1. expected 5, actual 6");
}

TEST(ReasonText, EmptyWhenTheGuardHolds) {
  const at::Tensor t = torch::zeros({3, 4});
  EXPECT_EQ(FailureReason(Make(GuardKind::kSize, 0, 3, 0), {t}, kNames), "");
  EXPECT_EQ(FailureReason(Make(GuardKind::kRank, 0, 2), {t}, kNames), "");
  EXPECT_EQ(FailureReason(DoubleGuard(0, std::nan("")), {std::nan("")}, kNames), "");
  EXPECT_EQ(FailureReason(Make(GuardKind::kArgType, 0, static_cast<int64_t>(ArgType::kTensor)),
                          {t}, kNames),
            "");
}

// --- Describe -----------------------------------------------------------------------------------

TEST(Describe, EveryKind) {
  const std::vector<std::string> names = {"x", "y", "n", "d", "b"};
  const int64_t cpu = DeviceCodeOf(torch::zeros({1}));
  EXPECT_EQ(Describe(Make(GuardKind::kGradMode, -1, 1), names), "grad_mode == true");
  EXPECT_EQ(Describe(Make(GuardKind::kInferenceMode, -1, 0), names), "inference_mode == false");
  EXPECT_EQ(Describe(Make(GuardKind::kDefaultDtype, -1, Dtype(at::kFloat)), names),
            "default_dtype == Float");
  EXPECT_EQ(Describe(Make(GuardKind::kArgCount, -1, 5), names), "len(args) == 5");
  EXPECT_EQ(Describe(Make(GuardKind::kArgType, 1, static_cast<int64_t>(ArgType::kTensor)), names),
            "type(y) == Tensor");
  EXPECT_EQ(Describe(Make(GuardKind::kArgType, 1, static_cast<int64_t>(ArgType::kUndefinedTensor)),
                     names),
            "type(y) == UndefinedTensor");
  EXPECT_EQ(Describe(Make(GuardKind::kDtype, 0, Dtype(at::kHalf)), names), "x.dtype == Half");
  EXPECT_EQ(Describe(Make(GuardKind::kDevice, 0, cpu), names), "x.device == cpu");
  EXPECT_EQ(Describe(Make(GuardKind::kLayout, 0, static_cast<int64_t>(c10::kStrided)), names),
            "x.layout == Strided");
  EXPECT_EQ(Describe(Make(GuardKind::kRequiresGrad, 0, 0), names), "x.requires_grad == false");
  EXPECT_EQ(Describe(Make(GuardKind::kRank, 0, 2), names), "x.dim() == 2");
  EXPECT_EQ(Describe(Make(GuardKind::kSize, 0, 3, /*dim=*/1), names), "x.size(1) == 3");
  EXPECT_EQ(Describe(Make(GuardKind::kStride, 1, 1, /*dim=*/0), names), "y.stride(0) == 1");
  EXPECT_EQ(Describe(Make(GuardKind::kIntValue, 2, -7), names), "n == -7");
  EXPECT_EQ(Describe(DoubleGuard(3, 0.5), names), "d == 0.5");
  EXPECT_EQ(Describe(DoubleGuard(3, -0.0), names), "d == -0.0");
  EXPECT_EQ(Describe(DoubleGuard(3, std::nan("")), names), "d == nan");
  EXPECT_EQ(Describe(Make(GuardKind::kBoolValue, 4, 1), names), "b == true");
  EXPECT_EQ(Describe(Make(GuardKind::kAliasing, 0, 1, -1, 1), names), "shares_storage(x, y)");
  EXPECT_EQ(Describe(Make(GuardKind::kAliasing, 0, 0, -1, 1), names), "!shares_storage(x, y)");
  EXPECT_EQ(Describe(Make(GuardKind::kSizeAtLeast, 0, 2, /*dim=*/1), names), "x.size(1) >= 2");
  EXPECT_EQ(Describe(Relation({{1, 0}, {0, 0}}, S(0), S(1), ""), names), "y.size(0) == x.size(0)");
  EXPECT_EQ(Describe(Relation({{1, 1}, {0, 0}}, S(0), S(1) * 2 - 1, ""), names),
            "y.size(1) == 2*x.size(0) - 1");
  // Missing names fall back to argN.
  EXPECT_EQ(Describe(Make(GuardKind::kSize, 7, 2, 0), names), "arg7.size(0) == 2");
}

TEST(GuardKindName, FollowsTheKindTable) {
  EXPECT_STREQ(GuardKindName(GuardKind::kGradMode), "grad_mode");
  EXPECT_STREQ(GuardKindName(GuardKind::kArgType), "type");
  EXPECT_STREQ(GuardKindName(GuardKind::kSize), "size");
  EXPECT_STREQ(GuardKindName(GuardKind::kStride), "stride");
  EXPECT_STREQ(GuardKindName(GuardKind::kDoubleValue), "double_value");
  EXPECT_STREQ(GuardKindName(GuardKind::kAliasing), "aliasing");
  // Cheap checks sort first: the evaluator relies on the enum order.
  EXPECT_LT(GuardKind::kArgCount, GuardKind::kArgType);
  EXPECT_LT(GuardKind::kArgType, GuardKind::kDtype);
  EXPECT_LT(GuardKind::kRank, GuardKind::kSize);
  EXPECT_LT(GuardKind::kLayout, GuardKind::kStride);
  EXPECT_LT(GuardKind::kRank, GuardKind::kSizeAtLeast);
  EXPECT_LT(GuardKind::kRank, GuardKind::kSizeRelation);
  EXPECT_STREQ(GuardKindName(GuardKind::kSizeAtLeast), "size_at_least");
  EXPECT_STREQ(GuardKindName(GuardKind::kSizeRelation), "size_relation");
}

// --- ArgTypeOf, Actual, Holds -------------------------------------------------------------------

TEST(ArgTypeOf, ClassifiesEveryArgumentKind) {
  EXPECT_EQ(ArgTypeOf(torch::zeros({1})), ArgType::kTensor);
  EXPECT_EQ(ArgTypeOf(at::Tensor()), ArgType::kUndefinedTensor);
  EXPECT_EQ(ArgTypeOf(int64_t{1}), ArgType::kInt);
  EXPECT_EQ(ArgTypeOf(1.0), ArgType::kDouble);
  EXPECT_EQ(ArgTypeOf(true), ArgType::kBool);
  EXPECT_EQ(ArgTypeOf(c10::IValue()), ArgType::kOther);
  EXPECT_EQ(ArgTypeOf(c10::IValue(std::string("s"))), ArgType::kOther);
  EXPECT_STREQ(ArgTypeName(ArgType::kUndefinedTensor), "UndefinedTensor");
  EXPECT_STREQ(ArgTypeName(ArgType::kBool), "Bool");
}

TEST(Actual, ReadsTheGuardedProperty) {
  const at::Tensor t = torch::zeros({4, 3}).t();  // sizes [3, 4], strides [1, 3]
  const Args args{t, int64_t{9}, 2.5};
  EXPECT_EQ(Actual(Make(GuardKind::kRank, 0), args), 2);
  EXPECT_EQ(Actual(Make(GuardKind::kSize, 0, 0, 1), args), 4);
  EXPECT_EQ(Actual(Make(GuardKind::kStride, 0, 0, 1), args), 3);
  EXPECT_EQ(Actual(Make(GuardKind::kSize, 0, 0, 5), args), -1) << "dim past the rank";
  EXPECT_EQ(Actual(Make(GuardKind::kSize, 1, 0, 0), args), -1) << "not a tensor";
  EXPECT_EQ(Actual(Make(GuardKind::kDtype, 0), args), Dtype(at::kFloat));
  EXPECT_EQ(Actual(Make(GuardKind::kIntValue, 1), args), 9);
  EXPECT_EQ(Actual(Make(GuardKind::kArgCount), args), 3);
  EXPECT_EQ(Actual(Make(GuardKind::kArgType, 2), args), static_cast<int64_t>(ArgType::kDouble));
  EXPECT_EQ(Actual(Make(GuardKind::kArgType, 5), args), static_cast<int64_t>(ArgType::kOther));
  EXPECT_EQ(Actual(Make(GuardKind::kGradMode), args), 1);
  {
    torch::NoGradGuard no_grad;
    EXPECT_EQ(Actual(Make(GuardKind::kGradMode), args), 0);
  }
  const at::Tensor base = torch::zeros({6});
  const Guard alias = Make(GuardKind::kAliasing, 0, 0, -1, 1);
  EXPECT_EQ(Actual(alias, {base, base.view({2, 3})}), 1);
  EXPECT_EQ(Actual(alias, {base, base.clone()}), 0);
  EXPECT_EQ(Actual(alias, {base, int64_t{1}}), 0);
}

TEST(Holds, SizeRelationAndAtLeast) {
  const Guard same = Relation({{0, 1}, {1, 0}}, S(0), S(1), "");
  EXPECT_TRUE(Holds(same, {torch::zeros({2, 7}), torch::zeros({7})}));
  EXPECT_FALSE(Holds(same, {torch::zeros({2, 7}), torch::zeros({6})}));
  // An unreadable symbol (not a tensor, undefined, dim past the rank) never satisfies a relation,
  // even when the arithmetic on the placeholder would.
  EXPECT_FALSE(Holds(same, {torch::zeros({2, 7}), int64_t{7}}));
  EXPECT_FALSE(Holds(same, {torch::zeros({2}), torch::zeros({2})}));
  const Guard product = Relation({{0, 0}, {0, 1}, {1, 0}}, S(0) * S(1), S(2), "");
  EXPECT_TRUE(Holds(product, {torch::zeros({3, 4}), torch::zeros({12})}));
  EXPECT_FALSE(Holds(product, {torch::zeros({3, 4}), torch::zeros({7})}));
  const Guard at_least = Make(GuardKind::kSizeAtLeast, 0, 2, /*dim=*/0);
  EXPECT_TRUE(Holds(at_least, {torch::zeros({2})}));
  EXPECT_FALSE(Holds(at_least, {torch::zeros({1})}));
  EXPECT_FALSE(Holds(at_least, {int64_t{5}}));
}

TEST(SymbolValues, ReadsSizesAndMarksUnreadableOnes) {
  Guard g = Relation({{0, 1}, {1, 0}, {0, 5}, {3, 0}}, S(0), S(1), "");
  EXPECT_EQ(SymbolValues(g, {torch::zeros({2, 7}), int64_t{3}}),
            (std::vector<int64_t>{7, -1, -1, -1}));
  EXPECT_EQ(SymbolValues(g, {torch::zeros({2, 7}), torch::zeros({4})}),
            (std::vector<int64_t>{7, 4, -1, -1}));
}

TEST(Holds, AliasingFollowsStorageNotIdentity) {
  const at::Tensor base = torch::zeros({2, 3});
  const Guard shared = Make(GuardKind::kAliasing, 0, 1, -1, 1);
  EXPECT_TRUE(Holds(shared, {base, base}));
  EXPECT_TRUE(Holds(shared, {base, base.select(0, 1)}));
  EXPECT_FALSE(Holds(shared, {base, base.clone()}));
  EXPECT_FALSE(Holds(shared, {base, int64_t{1}}));
}

TEST(Holds, DoubleValueUsesSameDouble) {
  EXPECT_TRUE(Holds(DoubleGuard(0, std::nan("")), {std::nan("")}));
  EXPECT_TRUE(Holds(DoubleGuard(0, std::nan("")), {-std::nan("7")}));
  EXPECT_FALSE(Holds(DoubleGuard(0, 0.0), {-0.0}));
  EXPECT_FALSE(Holds(DoubleGuard(0, -0.0), {0.0}));
  EXPECT_TRUE(Holds(DoubleGuard(0, 0.1 + 0.2), {0.1 + 0.2}));
  EXPECT_FALSE(Holds(DoubleGuard(0, 0.3), {0.1 + 0.2}));
  EXPECT_FALSE(Holds(DoubleGuard(0, 1.0), {int64_t{1}})) << "an int is not the double 1.0";
}

// --- SameDouble ---------------------------------------------------------------------------------

TEST(SameDouble, NanEqualsNanAndSignedZerosDiffer) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(SameDouble(std::nan(""), std::nan("")));
  EXPECT_TRUE(SameDouble(std::nan("1"), std::nan("2"))) << "every NaN payload is the same value";
  EXPECT_TRUE(SameDouble(std::nan(""), -std::nan("")));
  EXPECT_FALSE(SameDouble(std::nan(""), 0.0));
  EXPECT_FALSE(SameDouble(1.0, std::nan("")));
  EXPECT_FALSE(SameDouble(-0.0, 0.0));
  EXPECT_FALSE(SameDouble(0.0, -0.0));
  EXPECT_TRUE(SameDouble(-0.0, -0.0));
  EXPECT_TRUE(SameDouble(0.0, 0.0));
  EXPECT_TRUE(SameDouble(1.5, 1.5));
  EXPECT_FALSE(SameDouble(1.0, std::nextafter(1.0, 2.0)));
  EXPECT_TRUE(SameDouble(inf, inf));
  EXPECT_FALSE(SameDouble(inf, -inf));
}

}  // namespace
}  // namespace warden::guards
