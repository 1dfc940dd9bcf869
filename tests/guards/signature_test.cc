// Tests of guards/signature.cc: a call that satisfies a guard list hashes (HashCall over the
// list's mask) to the list's key; calls differing in a keyed property hash elsewhere; missing or
// wrongly typed arguments are safe; unkeyed guards do not take part.
#include "guards/signature.h"

#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "guards/evaluator.h"

namespace warden::guards {
namespace {

using Args = std::vector<c10::IValue>;

Guard Make(GuardKind kind, int arg = -1, int64_t expected = 0, int dim = -1) {
  Guard g{kind};
  g.arg = arg;
  g.dim = dim;
  g.expected = expected;
  return g;
}

Guard DoubleGuard(int arg, double expected) {
  Guard g = Make(GuardKind::kDoubleValue, arg);
  g.expected_double = expected;
  return g;
}

int64_t Code(ArgType t) { return static_cast<int64_t>(t); }

// The guards of f(x: f32[3, 4], n: int = 2, d: double, b: bool), in evaluation order.
std::vector<Guard> Guards(double d = 0.5) {
  std::vector<Guard> g = {
      Make(GuardKind::kGradMode, -1, 1),
      Make(GuardKind::kArgCount, -1, 4),
      Make(GuardKind::kArgType, 0, Code(ArgType::kTensor)),
      Make(GuardKind::kArgType, 1, Code(ArgType::kInt)),
      Make(GuardKind::kArgType, 2, Code(ArgType::kDouble)),
      Make(GuardKind::kArgType, 3, Code(ArgType::kBool)),
      Make(GuardKind::kDtype, 0, static_cast<int64_t>(at::kFloat)),
      Make(GuardKind::kRank, 0, 2),
      Make(GuardKind::kSize, 0, 3, 0),
      Make(GuardKind::kSize, 0, 4, 1),
      Make(GuardKind::kStride, 0, 4, 0),
      Make(GuardKind::kIntValue, 1, 2),
      DoubleGuard(2, d),
      Make(GuardKind::kBoolValue, 3, 1),
  };
  return GuardProgram(g).guards();
}

uint64_t Hash(const Signature& s, const Args& args) {
  return HashCall(s.mask, args.data(), args.size());
}

TEST(Signature, MaskHoldsOnlyExactMatchKindsInEvaluationOrder) {
  const Signature s = SignatureOf(Guards());
  std::vector<GuardKind> kinds;
  for (const Probe& p : s.mask) kinds.push_back(p.kind);
  EXPECT_THAT(kinds, ::testing::ElementsAre(GuardKind::kArgCount, GuardKind::kArgType,
                                            GuardKind::kArgType, GuardKind::kArgType,
                                            GuardKind::kArgType, GuardKind::kDtype, GuardKind::kRank,
                                            GuardKind::kSize, GuardKind::kSize, GuardKind::kIntValue,
                                            GuardKind::kDoubleValue, GuardKind::kBoolValue));
  EXPECT_EQ(s.mask[8].arg, 0);
  EXPECT_EQ(s.mask[8].dim, 1);
}

TEST(Signature, AMatchingCallHashesToTheKey) {
  const Signature s = SignatureOf(Guards());
  const Args call{torch::randn({3, 4}), int64_t{2}, 0.5, true};
  ASSERT_TRUE(GuardProgram(Guards()).Check(call));
  EXPECT_EQ(Hash(s, call), s.key);
  // Properties outside the mask (strides, requires_grad, values) do not change the hash.
  EXPECT_EQ(Hash(s, {torch::randn({4, 3}).t(), int64_t{2}, 0.5, true}), s.key);
  EXPECT_EQ(Hash(s, {torch::zeros({3, 4}, torch::requires_grad()), int64_t{2}, 0.5, true}), s.key);
}

TEST(Signature, ACallDifferingInAKeyedPropertyHashesElsewhere) {
  const Signature s = SignatureOf(Guards());
  const std::vector<Args> others = {
      {torch::randn({5, 4}), int64_t{2}, 0.5, true},
      {torch::randn({3, 5}), int64_t{2}, 0.5, true},
      {torch::randn({3, 4, 1}), int64_t{2}, 0.5, true},
      {torch::randn({3, 4}, torch::kDouble), int64_t{2}, 0.5, true},
      {torch::randn({3, 4}), int64_t{3}, 0.5, true},
      {torch::randn({3, 4}), int64_t{2}, 0.25, true},
      {torch::randn({3, 4}), int64_t{2}, 0.5, false},
  };
  for (size_t i = 0; i < others.size(); ++i) EXPECT_NE(Hash(s, others[i]), s.key) << "call #" << i;
}

TEST(Signature, WrongTypesAndMissingArgumentsAreSafeAndDoNotMatch) {
  const Signature s = SignatureOf(Guards());
  const std::vector<Args> bad = {
      {},
      {torch::randn({3, 4})},
      {int64_t{3}, int64_t{2}, 0.5, true},
      {at::Tensor(), int64_t{2}, 0.5, true},
      {torch::randn({3, 4}), 2.0, 0.5, true},
      {torch::randn({3, 4}), int64_t{2}, int64_t{0}, true},
      {torch::randn({3, 4}), int64_t{2}, 0.5, int64_t{1}},
      {torch::randn({3}), int64_t{2}, 0.5, true},  // size(1) past the rank
      {c10::IValue(std::string("s")), c10::IValue(), 0.5, true},
  };
  for (size_t i = 0; i < bad.size(); ++i) EXPECT_NE(Hash(s, bad[i]), s.key) << "call #" << i;
}

TEST(Signature, DoubleKeysFollowGuardEquality) {
  const Signature nan = SignatureOf(Guards(std::nan("")));
  EXPECT_EQ(Hash(nan, {torch::randn({3, 4}), int64_t{2}, std::nan("5"), true}), nan.key)
      << "every NaN is the same value for guards";
  EXPECT_EQ(Hash(nan, {torch::randn({3, 4}), int64_t{2}, -std::nan(""), true}), nan.key);
  const Signature zero = SignatureOf(Guards(0.0));
  EXPECT_EQ(Hash(zero, {torch::randn({3, 4}), int64_t{2}, 0.0, true}), zero.key);
  EXPECT_NE(Hash(zero, {torch::randn({3, 4}), int64_t{2}, -0.0, true}), zero.key);
  EXPECT_NE(SignatureOf(Guards(0.0)).key, SignatureOf(Guards(-0.0)).key);
}

TEST(Signature, UnkeyedGuardsDoNotChangeTheSignature) {
  std::vector<Guard> base = {Make(GuardKind::kArgCount, -1, 1),
                             Make(GuardKind::kArgType, 0, Code(ArgType::kTensor)),
                             Make(GuardKind::kRank, 0, 1), Make(GuardKind::kSize, 0, 3, 0)};
  std::vector<Guard> more = base;
  more.push_back(Make(GuardKind::kStride, 0, 1, 0));
  more.push_back(Make(GuardKind::kRequiresGrad, 0, 0));
  more.push_back(Make(GuardKind::kSizeAtLeast, 0, 2, 0));
  const Signature a = SignatureOf(GuardProgram(base).guards());
  const Signature b = SignatureOf(GuardProgram(more).guards());
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.mask, b.mask);
  // A dynamic dim has no size probe: any size hashes alike.
  std::vector<Guard> dynamic = {Make(GuardKind::kArgCount, -1, 1),
                                Make(GuardKind::kArgType, 0, Code(ArgType::kTensor)),
                                Make(GuardKind::kRank, 0, 1),
                                Make(GuardKind::kSizeAtLeast, 0, 2, 0)};
  const Signature d = SignatureOf(GuardProgram(dynamic).guards());
  EXPECT_EQ(HashCall(d.mask, Args{torch::zeros({3})}.data(), 1), d.key);
  EXPECT_EQ(HashCall(d.mask, Args{torch::zeros({300})}.data(), 1), d.key);
}

TEST(Signature, EmptyGuardListMatchesEverything) {
  const Signature s = SignatureOf({});
  EXPECT_TRUE(s.mask.empty());
  EXPECT_EQ(Hash(s, {}), s.key);
  EXPECT_EQ(Hash(s, {torch::zeros({2}), int64_t{1}}), s.key);
}

}  // namespace
}  // namespace warden::guards
