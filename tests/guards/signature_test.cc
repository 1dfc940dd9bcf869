// Tests of guards/signature.cc: a call that satisfies a guard list hashes (HashCall over the
// list's mask) to the list's key; calls differing in a keyed property hash elsewhere; missing or
// wrongly typed arguments are safe; unkeyed guards do not take part.
#include "guards/signature.h"

#include <algorithm>
#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "guards/evaluator.h"

#include "tests/guards/guard_test_util.h"

namespace warden::guards {
namespace {

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
  std::vector<int64_t> values(s.mask.size());
  return HashCall(s.mask, args.data(), args.size(), values.data());
}

TEST(Signature, MaskHoldsOnlyExactMatchKindsGroupedByArgument) {
  const Signature s = SignatureOf(Guards());
  std::vector<std::pair<int, GuardKind>> probes;
  for (const Probe& p : s.mask) probes.push_back({p.arg, p.kind});
  // Argument by argument, so HashCall reads each argument once.
  EXPECT_THAT(probes, ::testing::ElementsAre(
                          std::make_pair(-1, GuardKind::kArgCount),
                          std::make_pair(0, GuardKind::kArgType), std::make_pair(0, GuardKind::kDtype),
                          std::make_pair(0, GuardKind::kRank), std::make_pair(0, GuardKind::kSize),
                          std::make_pair(0, GuardKind::kSize), std::make_pair(1, GuardKind::kArgType),
                          std::make_pair(1, GuardKind::kIntValue), std::make_pair(2, GuardKind::kArgType),
                          std::make_pair(2, GuardKind::kDoubleValue), std::make_pair(3, GuardKind::kArgType),
                          std::make_pair(3, GuardKind::kBoolValue)));
  EXPECT_EQ(s.mask[5].arg, 0);
  EXPECT_EQ(s.mask[5].dim, 1);
  EXPECT_EQ(s.values.size(), s.mask.size());
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
  std::vector<int64_t> values(d.mask.size());
  EXPECT_EQ(HashCall(d.mask, Args{torch::zeros({3})}.data(), 1, values.data()), d.key);
  EXPECT_EQ(values, d.values);
  EXPECT_EQ(HashCall(d.mask, Args{torch::zeros({300})}.data(), 1, values.data()), d.key);
  EXPECT_EQ(values, d.values);
}

TEST(Signature, EmptyGuardListMatchesEverything) {
  const Signature s = SignatureOf({});
  EXPECT_TRUE(s.mask.empty());
  EXPECT_EQ(Hash(s, {}), s.key);
  EXPECT_EQ(Hash(s, {torch::zeros({2}), int64_t{1}}), s.key);
}

}  // namespace
}  // namespace warden::guards

namespace warden::guards {
namespace {

// The hit path's per-entry check (HitCheck: tensor records, autograd state, then the rest) must
// accept exactly what the full program accepts, and so must the signature-hash filter in front of it.
TEST(HitCheck, AgreesWithTheFullProgram) {
  std::vector<Guard> guards = {
      {GuardKind::kGradMode, -1, -1, -1, 0, 0, "g"},
      {GuardKind::kArgCount, -1, -1, -1, 3, 0, "n"},
      {GuardKind::kArgType, 0, -1, -1, static_cast<int64_t>(ArgType::kTensor), 0, "t"},
      {GuardKind::kArgType, 1, -1, -1, static_cast<int64_t>(ArgType::kTensor), 0, "t"},
      {GuardKind::kArgType, 2, -1, -1, static_cast<int64_t>(ArgType::kDouble), 0, "t"},
      {GuardKind::kDtype, 0, -1, -1, static_cast<int64_t>(at::kFloat), 0, "d"},
      {GuardKind::kDtype, 1, -1, -1, static_cast<int64_t>(at::kFloat), 0, "d"},
      {GuardKind::kDevice, 0, -1, -1, static_cast<int64_t>(c10::DeviceType::CPU) << 16 | 0xffff, 0, "v"},
      {GuardKind::kDevice, 1, -1, -1, static_cast<int64_t>(c10::DeviceType::CPU) << 16 | 0xffff, 0, "v"},
      {GuardKind::kLayout, 0, -1, -1, static_cast<int64_t>(c10::kStrided), 0, "l"},
      {GuardKind::kLayout, 1, -1, -1, static_cast<int64_t>(c10::kStrided), 0, "l"},
      {GuardKind::kRequiresGrad, 0, -1, -1, 0, 0, "r"},
      {GuardKind::kRequiresGrad, 1, -1, -1, 1, 0, "r"},
      {GuardKind::kRank, 0, -1, -1, 2, 0, "k"},
      {GuardKind::kRank, 1, -1, -1, 1, 0, "k"},
      {GuardKind::kSize, 0, 1, -1, 4, 0, "s"},
      {GuardKind::kSizeAtLeast, 0, 0, -1, 2, 0, "dyn"},
      {GuardKind::kSize, 1, 0, -1, 4, 0, "s"},
  };
  Guard d{GuardKind::kDoubleValue, 2, -1, -1, 0, 0.5, "x"};
  guards.push_back(d);
  const GuardProgram full(guards);
  const HitCheck hit(full.guards());
  const Signature sig = SignatureOf(full.guards());
  EXPECT_EQ(hit.num_tensor_records(), 2u);
  EXPECT_LT(hit.rest().size(), full.size());

  torch::NoGradGuard no_grad;
  auto grad = torch::zeros({4}).requires_grad_();
  const std::vector<Args> calls = {
      {torch::zeros({3, 4}), grad, 0.5},                       // passes
      {torch::zeros({7, 4}), grad, 0.5},                       // passes (dynamic dim)
      {torch::zeros({1, 4}), grad, 0.5},                       // >= 2 fails
      {torch::zeros({3, 5}), grad, 0.5},                       // static size
      {torch::zeros({3, 4}), torch::zeros({4}), 0.5},          // requires_grad
      {torch::zeros({3, 4}, torch::kDouble), grad, 0.5},       // dtype
      {torch::zeros({3, 4}), grad, 0.25},                      // scalar value
      {torch::zeros({3, 4}), grad, int64_t{1}},                // scalar type
      {torch::zeros({3, 4}), grad},                            // arity
      {torch::zeros({3, 4}).to_sparse(), grad, 0.5},           // layout
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    const Args& a = calls[i];
    std::vector<int64_t> values(sig.mask.size());
    const uint64_t key = HashCall(sig.mask, a.data(), a.size(), values.data());
    EXPECT_EQ(hit.Check(a.data(), a.size()), full.Check(a))
        << "call " << i << ": " << full.FirstFailure(a, {"a", "b", "c"});
    if (full.Check(a)) EXPECT_TRUE(key == sig.key && values == sig.values) << "call " << i;
  }
  EXPECT_TRUE(full.Check(calls[0]));
  EXPECT_TRUE(full.Check(calls[1]));
}

}  // namespace
}  // namespace warden::guards

namespace warden::guards {
namespace {

TEST(ProbePlan, HashesAndValuesEqualTheMaskPath) {
  const Signature s = SignatureOf(Guards());
  const ProbePlan plan = PlanOf(s.mask);
  EXPECT_EQ(plan.num_values, s.mask.size());
  const std::vector<Args> calls = {
      {torch::randn({3, 4}), int64_t{2}, 0.5, true},
      {torch::randn({5, 4}), int64_t{2}, 0.5, true},
      {torch::randn({3}), int64_t{2}, 0.5, true},
      {int64_t{1}, torch::randn({3, 4}), 0.5, true},
      {torch::randn({3, 4}), int64_t{2}},
      {torch::randn({3, 4}), int64_t{2}, std::nan(""), false, int64_t{9}},
      {c10::IValue(at::Tensor()), int64_t{2}, 0.5, true},
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    std::vector<int64_t> a(s.mask.size()), b(s.mask.size());
    const uint64_t ha = HashCall(s.mask, calls[i].data(), calls[i].size(), a.data());
    const uint64_t hb = HashCall(plan, calls[i].data(), calls[i].size(), b.data());
    EXPECT_EQ(ha, hb) << "call " << i;
    EXPECT_EQ(a, b) << "call " << i;
  }
}

}  // namespace
}  // namespace warden::guards

namespace warden::guards {
namespace {

// Signatures of one mask that differ in one size: one probe, the size itself is the key, and a
// call finds exactly the entry of its size.
TEST(SignatureIndex, FindsTheEntryOfTheCallsSizeWithOneProbe) {
  std::vector<Signature> sigs;
  for (int64_t rows = 2; rows < 66; ++rows) {
    sigs.push_back(SignatureOf(GuardProgram({Make(GuardKind::kArgCount, -1, 1),
                                             Make(GuardKind::kArgType, 0, Code(ArgType::kTensor)),
                                             Make(GuardKind::kRank, 0, 2), Make(GuardKind::kSize, 0, rows, 0),
                                             Make(GuardKind::kSize, 0, 4, 1)})
                                   .guards()));
  }
  std::vector<const Signature*> ptrs;
  for (const Signature& s : sigs) ptrs.push_back(&s);
  const SignatureIndex index(ptrs);
  EXPECT_EQ(index.num_probes(), 1u);
  for (int64_t rows = 2; rows < 66; ++rows) {
    const Args a{torch::zeros({rows, 4})};
    const SignatureIndex::Range c = index.Candidates(a.data(), a.size());
    ASSERT_EQ(c.end - c.begin, 1) << rows;
    EXPECT_EQ(*c.begin, static_cast<uint32_t>(rows - 2));
  }
  // No candidate where the probe reads no known size. (Candidates are not confirmed: a [3] tensor
  // is a candidate for the [3, 4] entry, whose HitCheck then rejects it.)
  for (const Args& a : std::vector<Args>{{torch::zeros({70, 4})}, {torch::zeros({1})}, {int64_t{3}},
                                         {c10::IValue(at::Tensor())}, {}}) {
    const SignatureIndex::Range c = index.Candidates(a.data(), a.size());
    EXPECT_EQ(c.begin, c.end);
  }
}

// Identical signatures (entries that differ only in unkeyed guards): no probe, all candidates in
// the given order. Several differing probes: hashed, and every matching signature is found.
TEST(SignatureIndex, NoProbeForIdenticalSignaturesAndHashesSeveralProbes) {
  const Signature a = SignatureOf(Guards());
  const SignatureIndex same({&a, &a, &a});
  EXPECT_EQ(same.num_probes(), 0u);
  const Args call{torch::randn({9, 9})};
  const SignatureIndex::Range all = same.Candidates(call.data(), call.size());
  ASSERT_EQ(all.end - all.begin, 3);
  EXPECT_EQ(all.begin[0], 0u);
  EXPECT_EQ(all.begin[2], 2u);

  const Signature b = SignatureOf(Guards(0.25));
  std::vector<Guard> g = Guards();
  for (Guard& x : g) {
    if (x.kind == GuardKind::kIntValue) x.expected = 7;
  }
  const Signature c = SignatureOf(GuardProgram(g).guards());
  const SignatureIndex index({&a, &b, &c});
  EXPECT_EQ(index.num_probes(), 2u);  // the int and the double
  const std::vector<std::pair<Args, uint32_t>> calls = {
      {{torch::randn({3, 4}), int64_t{2}, 0.5, true}, 0u},
      {{torch::randn({3, 4}), int64_t{2}, 0.25, true}, 1u},
      {{torch::randn({3, 4}), int64_t{7}, 0.5, true}, 2u},
  };
  for (const auto& [args, want] : calls) {
    const SignatureIndex::Range r = index.Candidates(args.data(), args.size());
    EXPECT_NE(std::find(r.begin, r.end, want), r.end) << want;
  }
  const Args none{torch::randn({3, 4}), int64_t{7}, 0.25, true};
  const SignatureIndex::Range r = index.Candidates(none.data(), none.size());
  for (const uint32_t* p = r.begin; p != r.end; ++p) EXPECT_NE(*p, 0u);  // collisions only
}

// ProbeValue (the single-probe lookup) reads what the plan path of HashCall reads, probe by probe.
TEST(ProbeValue, EqualsThePlanPathsValues) {
  const Signature s = SignatureOf(Guards());
  const ProbePlan plan = PlanOf(s.mask);
  for (const Args& a : std::vector<Args>{{torch::randn({3, 4}), int64_t{2}, 0.5, true},
                                         {torch::randn({3}), 1.0, int64_t{2}},
                                         {c10::IValue(at::Tensor())},
                                         {}}) {
    std::vector<int64_t> values(s.mask.size());
    HashCall(plan, a.data(), a.size(), values.data());
    for (size_t i = 0; i < s.mask.size(); ++i) {
      EXPECT_EQ(ProbeValue(s.mask[i], a.data(), a.size()), values[i]) << i;
    }
  }
}

}  // namespace
}  // namespace warden::guards
