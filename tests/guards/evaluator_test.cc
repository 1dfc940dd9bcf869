// Tests of guards/evaluator.cc: the compiled GuardProgram must agree with the reference Holds() of
// guards/guard.cc for every guard kind, run cheap checks first (so a wrong-type argument never
// reaches a tensor check), and explain the first failure with its reason text.
#include "tracer/autocast_compat.h"
#include "guards/evaluator.h"

#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include <c10/core/DefaultDtype.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "guards/guard.h"
#include "tests/guards/guard_test_util.h"

namespace warden::guards {
namespace {

Guard Relation(std::vector<std::pair<int, int>> symbols, tracer::SymExpr lhs, tracer::SymExpr rhs) {
  Guard g = Make(GuardKind::kSizeRelation, symbols.at(0).first, 0, symbols.at(0).second);
  g.symbols = std::move(symbols);
  g.lhs = std::move(lhs);
  g.rhs = std::move(rhs);
  g.provenance = "required by test";
  return g;
}

tracer::SymExpr S(int k) { return tracer::SymExpr::Symbol(k); }

Guard Type(int arg, ArgType t) { return Make(GuardKind::kArgType, arg, static_cast<int64_t>(t)); }
Guard Count(int n) { return Make(GuardKind::kArgCount, -1, n); }

bool AllHold(const std::vector<Guard>& guards, const Args& args) {
  for (const Guard& g : guards) {
    if (!Holds(g, args)) return false;
  }
  return true;
}

int64_t DeviceCodeOf(const at::Tensor& t) { return Actual(Make(GuardKind::kDevice, 0), {t}); }

// One guard kind: the guards of a program (the guard under test plus the count/type guards that
// make its argument well-typed, as the builder always emits), inputs it passes and inputs it fails.
struct Case {
  std::string name;
  std::vector<Guard> guards;
  std::vector<Args> passing;
  std::vector<Args> failing;
};

// The program and the hit path's HitCheck (records where the guards allow, the rest as a program).
void ExpectAgreement(const Case& c) {
  const GuardProgram program(c.guards);
  const HitCheck hit(c.guards);
  for (size_t i = 0; i < c.passing.size(); ++i) {
    EXPECT_TRUE(AllHold(c.guards, c.passing[i])) << c.name << " passing #" << i << " (Holds)";
    EXPECT_TRUE(program.Check(c.passing[i])) << c.name << " passing #" << i << " (Check)";
    EXPECT_TRUE(hit.Check(c.passing[i])) << c.name << " passing #" << i << " (HitCheck)";
    EXPECT_EQ(program.FirstFailure(c.passing[i], {}), "") << c.name << " passing #" << i;
  }
  for (size_t i = 0; i < c.failing.size(); ++i) {
    EXPECT_FALSE(AllHold(c.guards, c.failing[i])) << c.name << " failing #" << i << " (Holds)";
    EXPECT_FALSE(program.Check(c.failing[i])) << c.name << " failing #" << i << " (Check)";
    EXPECT_FALSE(hit.Check(c.failing[i])) << c.name << " failing #" << i << " (HitCheck)";
    EXPECT_NE(program.FirstFailure(c.failing[i], {}), "") << c.name << " failing #" << i;
  }
}

TEST(GuardProgram, AgreesWithHoldsForTensorAndScalarKinds) {
  const at::Tensor f = torch::zeros({3, 4});
  const at::Tensor d = torch::zeros({3, 4}, torch::kDouble);
  const at::Tensor meta = torch::empty({3, 4}, torch::TensorOptions().device(torch::kMeta));
  const at::Tensor sparse = torch::zeros({3, 4}).to_sparse();
  const at::Tensor grad = torch::zeros({3, 4}, torch::requires_grad());
  const at::Tensor transposed = torch::zeros({4, 3}).t();  // [3, 4], strides [1, 3]
  const std::vector<Guard> tensor0 = {Count(1), Type(0, ArgType::kTensor)};
  auto with = [&](std::vector<Guard> base, std::vector<Guard> more) {
    base.insert(base.end(), more.begin(), more.end());
    return base;
  };
  const std::vector<Case> cases = {
      {"arg_count", {Count(2)}, {{f, f}, {int64_t{1}, 2.0}}, {{f}, {}, {f, f, f}}},
      {"type Tensor",
       {Count(1), Type(0, ArgType::kTensor)},
       {{f}, {d}},
       {{int64_t{1}}, {1.0}, {true}, {at::Tensor()}, {c10::IValue(std::string("s"))}, {c10::IValue()}}},
      {"type UndefinedTensor", {Count(1), Type(0, ArgType::kUndefinedTensor)}, {{at::Tensor()}}, {{f}}},
      {"type Int", {Count(1), Type(0, ArgType::kInt)}, {{int64_t{0}}}, {{0.0}, {false}, {f}}},
      {"type Double", {Count(1), Type(0, ArgType::kDouble)}, {{0.0}}, {{int64_t{0}}, {f}}},
      {"type Bool", {Count(1), Type(0, ArgType::kBool)}, {{false}}, {{int64_t{0}}}},
      {"dtype", with(tensor0, {Make(GuardKind::kDtype, 0, static_cast<int64_t>(at::kFloat))}), {{f}},
       {{d}, {torch::zeros({3, 4}, torch::kLong)}}},
      {"device", with(tensor0, {Make(GuardKind::kDevice, 0, DeviceCodeOf(f))}), {{f}}, {{meta}}},
      {"layout", with(tensor0, {Make(GuardKind::kLayout, 0, static_cast<int64_t>(c10::kStrided))}),
       {{f}}, {{sparse}}},
      {"requires_grad", with(tensor0, {Make(GuardKind::kRequiresGrad, 0, 0)}), {{f}}, {{grad}}},
      {"rank", with(tensor0, {Make(GuardKind::kRank, 0, 2)}), {{f}, {torch::zeros({1, 1})}},
       {{torch::zeros({12})}, {torch::zeros({3, 4, 1})}, {torch::tensor(1.0)}}},
      {"size",
       with(tensor0, {Make(GuardKind::kRank, 0, 2), Make(GuardKind::kSize, 0, 4, /*dim=*/1)}),
       {{f}, {torch::zeros({7, 4})}},
       {{torch::zeros({4, 3})}, {torch::zeros({3, 5})}, {torch::zeros({4})}}},
      {"stride",
       with(tensor0, {Make(GuardKind::kRank, 0, 2), Make(GuardKind::kStride, 0, 4, /*dim=*/0)}),
       {{f}, {torch::zeros({9, 4})}},
       {{transposed}, {torch::zeros({3, 5})}, {torch::zeros({3, 8}).slice(1, 0, 8, 2)}}},
      {"size_at_least",
       with(tensor0, {Make(GuardKind::kRank, 0, 2), Make(GuardKind::kSizeAtLeast, 0, 2, /*dim=*/0)}),
       {{f}, {torch::zeros({2, 9})}, {torch::zeros({1000, 1})}},
       {{torch::zeros({1, 4})}, {torch::zeros({0, 4})}, {torch::zeros({5})}, {int64_t{5}}}},
      {"int_value", {Count(1), Type(0, ArgType::kInt), Make(GuardKind::kIntValue, 0, 3)},
       {{int64_t{3}}}, {{int64_t{4}}, {int64_t{-3}}}},
      {"double_value", {Count(1), Type(0, ArgType::kDouble), DoubleGuard(0, 0.5)}, {{0.5}},
       {{0.25}, {-0.5}, {std::nan("")}}},
      {"double_value nan", {Count(1), Type(0, ArgType::kDouble), DoubleGuard(0, std::nan(""))},
       {{std::nan("")}, {std::nan("3")}, {-std::nan("")}}, {{0.0}, {1.0}}},
      {"double_value +0.0", {Count(1), Type(0, ArgType::kDouble), DoubleGuard(0, 0.0)}, {{0.0}},
       {{-0.0}}},
      {"double_value -0.0", {Count(1), Type(0, ArgType::kDouble), DoubleGuard(0, -0.0)}, {{-0.0}},
       {{0.0}}},
      {"bool_value", {Count(1), Type(0, ArgType::kBool), Make(GuardKind::kBoolValue, 0, 1)}, {{true}},
       {{false}}},
  };
  for (const Case& c : cases) ExpectAgreement(c);
}

TEST(GuardProgram, AgreesWithHoldsForAliasing) {
  const at::Tensor a = torch::zeros({2, 3}), b = torch::zeros({2, 3});
  const std::vector<Guard> types = {Count(2), Type(0, ArgType::kTensor), Type(1, ArgType::kTensor)};
  std::vector<Guard> distinct = types, shared = types;
  distinct.push_back(Make(GuardKind::kAliasing, 0, 0, -1, 1));
  shared.push_back(Make(GuardKind::kAliasing, 0, 1, -1, 1));
  ExpectAgreement({"aliasing distinct", distinct, {{a, b}, {a, a.clone()}}, {{a, a}, {a, a.select(0, 1)}}});
  ExpectAgreement({"aliasing shared", shared, {{a, a}, {a, a.t()}, {a.select(0, 0), a.select(0, 1)}},
                   {{a, b}}});
}

// One identity pattern set over n tensor arguments (and one int between them); `records`: with
// the metadata guards the builder emits, so HitCheck keeps a record per argument.
void ExpectIdentityAgreement(int n, bool records) {
  Args distinct;
  for (int i = 0; i < n; ++i) distinct.push_back(torch::zeros({1}));
  distinct.insert(distinct.begin() + 1, c10::IValue(int64_t{7}));
  std::vector<Guard> types = {Count(static_cast<int>(distinct.size()))};
  for (size_t i = 0; i < distinct.size(); ++i) {
    const int a = static_cast<int>(i);
    types.push_back(Type(a, i == 1 ? ArgType::kInt : ArgType::kTensor));
    if (i == 1 || !records) continue;
    // What the builder emits for every tensor argument: HitCheck then keeps a record for each,
    // and compares all-distinct arguments in its record loop (up to 64 of them).
    types.push_back(Make(GuardKind::kDtype, a, static_cast<int64_t>(at::kFloat)));
    types.push_back(Make(GuardKind::kDevice, a, DeviceCodeOf(distinct[0].toTensor())));
    types.push_back(Make(GuardKind::kLayout, a, static_cast<int64_t>(at::kStrided)));
    types.push_back(Make(GuardKind::kRequiresGrad, a, 0));
  }
  Args repeated = distinct, other = distinct, all_same = distinct;
  repeated.back() = repeated[0];
  repeated[2] = repeated[0];
  other.back() = other[3];
  for (size_t i = 0; i < all_same.size(); ++i) {
    if (i != 1) all_same[i] = distinct[0];
  }
  auto with = [&](const Args& traced) {
    std::vector<Guard> g = types;
    Guard id = Make(GuardKind::kArgIdentity);
    id.same_as = IdentityOf(traced);
    g.push_back(id);
    return g;
  };
  ExpectAgreement({"distinct", with(distinct), {distinct}, {repeated, other, all_same}});
  ExpectAgreement({"repeated", with(repeated), {repeated}, {distinct, other, all_same}});
  ExpectAgreement({"all same", with(all_same), {all_same}, {distinct, repeated, other}});
}

// Identity through the pairwise path (up to 8 arguments; fused into the record loop up to 64 when
// all are distinct), the hashed one beyond, and the pairwise fallback past 512: the same answer as
// Holds().
TEST(GuardProgram, AgreesWithHoldsForArgumentIdentity) {
  for (int n : {4, 8, 9, 16, 17, 40, 600}) {
    for (bool records : {false, true}) {
      SCOPED_TRACE(testing::Message() << n << " arguments, records " << records);
      ExpectIdentityAgreement(n, records);
    }
  }
}

TEST(GuardProgram, ArgumentIdentityTexts) {
  const at::Tensor a = torch::zeros({1}), b = torch::zeros({1});
  Guard id = Make(GuardKind::kArgIdentity);
  id.same_as = IdentityOf({a, c10::IValue(1.5), a, b});
  EXPECT_EQ(id.same_as, (std::vector<int32_t>{0, -1, 0, 3}));
  const std::vector<std::string> names = {"x", "s", "y", "z"};
  EXPECT_EQ(Describe(id, names), "distinct tensors: x, z; y is x");
  EXPECT_EQ(FailureReason(id, {a, c10::IValue(1.5), a, b}, names), "");
  EXPECT_EQ(FailureReason(id, {a, c10::IValue(1.5), b, b}, names),
            "tensor 'y' identity mismatch. expected the same tensor as 'x', actual a distinct tensor");
  EXPECT_EQ(FailureReason(id, {a, c10::IValue(1.5), a, a}, names),
            "tensor 'z' identity mismatch. expected a distinct tensor, actual the same tensor as 'x'");
}

Guard CapturedGuard(const at::Tensor& t) {
  Guard g = Make(GuardKind::kCapturedTensor);
  g.captured = std::make_shared<const CapturedTensor>(CapturedTensor::Of(t, "%c0"));
  return g;
}

TEST(GuardProgram, CapturedTensorMetadata) {
  struct Change {
    std::string name;
    std::function<void(at::Tensor&)> apply;
    std::string reason;
  };
  const std::vector<Change> changes = {
      {"resize", [](at::Tensor& t) { t.resize_({2, 4}); }, "captured tensor %c0 size mismatch at index 1. expected 3, actual 4"},
      {"rank", [](at::Tensor& t) { t.resize_({6}); }, "captured tensor %c0 rank mismatch. expected 2, actual 1"},
      {"transpose", [](at::Tensor& t) { t.t_(); }, "captured tensor %c0 size mismatch at index 0. expected 2, actual 3"},
      {"strides", [](at::Tensor& t) { t.set_(t.storage(), 0, {2, 3}, {1, 2}); },
       "captured tensor %c0 stride mismatch at index 0. expected 3, actual 1"},
      {"offset", [](at::Tensor& t) { t.set_(t.storage(), 1, {2, 3}, {3, 1}); },
       "captured tensor %c0 storage offset mismatch. expected 0, actual 1"},
      {"dtype", [](at::Tensor& t) { t.set_data(t.to(at::kDouble)); }, "captured tensor %c0 dtype mismatch. expected Float, actual Double"},
      {"requires_grad", [](at::Tensor& t) { t.requires_grad_(true); },
       "captured tensor %c0 requires_grad mismatch. expected false, actual true"},
  };
  for (const Change& c : changes) {
    SCOPED_TRACE(c.name);
    // Storage for 16 floats: LibTorch 2.x checks that set_'s view fits (offset 1 needs 7).
    at::Tensor t = torch::zeros({16}, at::kFloat).narrow(0, 0, 6).view({2, 3});
    const Guard g = CapturedGuard(t);
    const GuardProgram program({g});
    const HitCheck hit({g});
    EXPECT_TRUE(program.Check(Args{}));
    EXPECT_TRUE(hit.Check(Args{}));
    EXPECT_EQ(program.FirstFailure({}, {}), "");
    c.apply(t);
    EXPECT_FALSE(program.Check(Args{}));
    EXPECT_FALSE(hit.Check(Args{}));
    EXPECT_EQ(program.FirstFailure({}, {}), c.reason);
  }
  const at::Tensor s = torch::ones({}, at::kLong);
  EXPECT_EQ(Describe(CapturedGuard(s), {}), "%c0 (captured): Long[] strides [] offset 0 on cpu, requires_grad false");
  EXPECT_TRUE(GuardProgram({CapturedGuard(s)}).Check(Args{}));
}

TEST(GuardProgram, AgreesWithHoldsForSizeRelations) {
  // The builder always emits the type and rank guards of every argument a relation reads.
  const std::vector<Guard> pre = {Count(2), Type(0, ArgType::kTensor), Type(1, ArgType::kTensor),
                                  Make(GuardKind::kRank, 0, 2), Make(GuardKind::kRank, 1, 1)};
  std::vector<Guard> same = pre, sum = pre;
  same.push_back(Relation({{1, 0}, {0, 1}}, S(0), S(1)));           // y.size(0) == x.size(1)
  sum.push_back(Relation({{1, 0}, {0, 0}, {0, 1}}, S(0), S(1) * S(2) + 1));  // y0 == x0*x1 + 1
  const at::Tensor x = torch::zeros({3, 4});
  ExpectAgreement({"relation ==", same, {{x, torch::zeros({4})}, {torch::zeros({9, 2}), torch::zeros({2})}},
                   {{x, torch::zeros({3})}, {x, torch::zeros({4, 4})}, {x, int64_t{4}}, {x}, {torch::zeros({4}), x}}});
  ExpectAgreement({"relation polynomial", sum, {{x, torch::zeros({13})}},
                   {{x, torch::zeros({12})}, {torch::zeros({4, 4}), torch::zeros({13})}}});
}

TEST(GuardProgram, AgreesWithHoldsForGlobalState) {
  const at::Tensor t = torch::zeros({2});
  const Args args{t};
  const GuardProgram grad({Make(GuardKind::kGradMode, -1, 1)});
  EXPECT_TRUE(grad.Check(args));
  EXPECT_TRUE(Holds(grad.guards()[0], args));
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(grad.Check(args));
    EXPECT_FALSE(Holds(grad.guards()[0], args));
    EXPECT_EQ(grad.FirstFailure(args, {}), "grad mode mismatch. expected enabled, actual disabled");
  }

  const GuardProgram inference({Make(GuardKind::kInferenceMode, -1, 0)});
  EXPECT_TRUE(inference.Check(args));
  {
    c10::InferenceMode mode;
    EXPECT_FALSE(inference.Check(args));
    EXPECT_FALSE(Holds(inference.guards()[0], args));
  }
  EXPECT_TRUE(Holds(inference.guards()[0], args));

  const GuardProgram dtype(
      {Make(GuardKind::kDefaultDtype, -1, static_cast<int64_t>(at::kFloat))});
  EXPECT_TRUE(dtype.Check(args));
  const caffe2::TypeMeta previous = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
  const bool checked = dtype.Check(args);
  const bool held = Holds(dtype.guards()[0], args);
  const std::string reason = dtype.FirstFailure(args, {});
  c10::set_default_dtype(previous);
  EXPECT_FALSE(checked);
  EXPECT_FALSE(held);
  EXPECT_EQ(reason, "default dtype mismatch. expected Float, actual Double");
}

// --- HitCheck records ----------------------------------------------------------------------------

// The guards the builder emits for a used tensor argument `arg` like `t` (so that HitCheck makes a
// record of them), with dim 0 either static or `>= 2`.
std::vector<Guard> UsedTensor(int arg, const at::Tensor& t, bool dim0_dynamic = false) {
  std::vector<Guard> g = {Type(arg, ArgType::kTensor),
                          Make(GuardKind::kDtype, arg, static_cast<int64_t>(t.scalar_type())),
                          Make(GuardKind::kDevice, arg, DeviceCodeOf(t)),
                          Make(GuardKind::kLayout, arg, static_cast<int64_t>(t.layout())),
                          Make(GuardKind::kRequiresGrad, arg, t.requires_grad()),
                          Make(GuardKind::kRank, arg, t.dim())};
  for (int64_t d = 0; d < t.dim(); ++d) {
    g.push_back(d == 0 && dim0_dynamic ? Make(GuardKind::kSizeAtLeast, arg, 2, 0)
                                       : Make(GuardKind::kSize, arg, t.size(d), static_cast<int>(d)));
  }
  return g;
}

// Every kind a record holds, each changed alone, plus the kinds that stay in the program next to
// records (strides, aliasing, relations, scalars, global state): HitCheck agrees with the program.
TEST(HitCheck, RecordsEnforceEveryGuardKind) {
  const at::Tensor x = torch::zeros({3, 4});
  const at::Tensor y = torch::zeros({5, 4});
  std::vector<Guard> guards = {Count(3), Make(GuardKind::kGradMode, -1, 1), Make(GuardKind::kInferenceMode, -1, 0),
                               Type(2, ArgType::kInt), Make(GuardKind::kIntValue, 2, 7)};
  for (const Guard& g : UsedTensor(0, x)) guards.push_back(g);
  for (const Guard& g : UsedTensor(1, y, /*dim0_dynamic=*/true)) guards.push_back(g);
  guards.push_back(Make(GuardKind::kStride, 0, 4, 0));
  guards.push_back(Make(GuardKind::kAliasing, 0, 0, -1, 1));
  const HitCheck hit(guards);
  EXPECT_EQ(hit.num_tensor_records(), 2u);
  EXPECT_EQ(hit.rest().size(), 4u);  // arg 2's type and value, the stride, the aliasing

  const at::Tensor meta = torch::empty({3, 4}, torch::TensorOptions().device(torch::kMeta));
  const at::Tensor sparse = torch::zeros({3, 4}).to_sparse();
  const at::Tensor grad = torch::zeros({3, 4}, torch::requires_grad());
  const at::Tensor transposed = torch::zeros({4, 3}).t();
  const int64_t seven = 7;
  ExpectAgreement({"records",
                   guards,
                   {{x, y, seven}, {torch::ones({3, 4}), torch::zeros({2, 4}), seven}, {x, torch::zeros({99, 4}), seven}},
                   {
                       {x, y},                                            // arity
                       {x, y, seven, seven},                              // arity
                       {y, y, seven},                                     // static size
                       {torch::zeros({3, 5}), y, seven},                  // static size, last dim
                       {x, torch::zeros({1, 4}), seven},                  // >= 2
                       {x, torch::zeros({0, 4}), seven},                  // >= 2
                       {x, torch::zeros({5, 3}), seven},                  // static dim next to a dynamic one
                       {torch::zeros({12}), y, seven},                    // rank
                       {torch::zeros({3, 4, 1}), y, seven},               // rank
                       {x, torch::zeros({5}), seven},                     // rank
                       {torch::zeros({3, 4}, torch::kDouble), y, seven},  // dtype
                       {x, torch::zeros({5, 4}, torch::kHalf), seven},    // dtype
                       {meta, y, seven},                                  // device
                       {sparse, y, seven},                                // layout
                       {grad, y, seven},                                  // requires_grad
                       {at::Tensor(), y, seven},                          // undefined tensor
                       {seven, y, seven},                                 // type
                       {3.0, y, seven},                                   // type
                       {x, y, int64_t{8}},                                // int value
                       {x, y, 7.0},                                       // scalar type
                       {transposed, y, seven},                            // stride (rest)
                       {x, x.view({3, 4}), seven},                        // aliasing (rest)
                   }});
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(hit.Check({x, y, seven}));
  }
  {
    c10::InferenceMode inference;
    EXPECT_FALSE(hit.Check({x, y, seven}));
  }
  EXPECT_TRUE(hit.Check({x, y, seven}));
}

// A relation between two recorded arguments (s0 == s1) stays in the program and still holds.
TEST(HitCheck, RelationsNextToRecords) {
  const at::Tensor a = torch::zeros({3, 4}), b = torch::zeros({3});
  std::vector<Guard> guards = {Count(2)};
  for (const Guard& g : UsedTensor(0, a, true)) guards.push_back(g);
  for (const Guard& g : UsedTensor(1, b, true)) guards.push_back(g);
  guards.push_back(Relation({{0, 0}, {1, 0}}, S(0), S(1)));
  EXPECT_EQ(HitCheck(guards).num_tensor_records(), 2u);
  ExpectAgreement({"relation", guards, {{a, b}, {torch::zeros({7, 4}), torch::zeros({7})}},
                   {{torch::zeros({7, 4}), torch::zeros({6})}, {a, torch::zeros({1})}}});
}

// Guards that cannot form a record (no dtype guard, two contradictory ranks, sizes without a
// rank) leave the argument's guards in the program, which enforces all of them.
TEST(HitCheck, ArgumentsWithoutARecordStayInTheProgram) {
  const at::Tensor x = torch::zeros({3, 4});
  std::vector<Guard> no_dtype = {Count(1)};
  for (const Guard& g : UsedTensor(0, x)) {
    if (g.kind != GuardKind::kDtype) no_dtype.push_back(g);
  }
  EXPECT_EQ(HitCheck(no_dtype).num_tensor_records(), 0u);
  ExpectAgreement({"no dtype", no_dtype, {{x}, {torch::zeros({3, 4}, torch::kDouble)}}, {{torch::zeros({3, 5})}}});

  std::vector<Guard> two_ranks = {Count(1)};
  for (const Guard& g : UsedTensor(0, x)) two_ranks.push_back(g);
  two_ranks.push_back(Make(GuardKind::kRank, 0, 3));
  EXPECT_EQ(HitCheck(two_ranks).num_tensor_records(), 0u);
  ExpectAgreement({"two ranks", two_ranks, {}, {{x}, {torch::zeros({3, 4, 1})}}});

  std::vector<Guard> two_sizes = {Count(1)};
  for (const Guard& g : UsedTensor(0, x)) two_sizes.push_back(g);
  two_sizes.push_back(Make(GuardKind::kSize, 0, 5, 0));  // contradicts size(0) == 3
  EXPECT_EQ(HitCheck(two_sizes).num_tensor_records(), 0u);
  ExpectAgreement({"two sizes", two_sizes, {}, {{x}, {torch::zeros({5, 4})}}});
}

// --- Word records (Note [Word records] in guards/evaluator.cc) ----------------------------------

// UsedTensor plus the dispatch-key guard the builder also emits: a word record when plain.
std::vector<Guard> UsedPlainTensor(int arg, const at::Tensor& t) {
  std::vector<Guard> g = UsedTensor(arg, t);
  g.push_back(Make(GuardKind::kDispatchKeys, arg, static_cast<int64_t>(t.key_set().raw_repr())));
  return g;
}

// A TensorImpl over another tensor's storage, with that tensor's key set, dtype, sizes and
// strides in its fields, and one policy set: sizes(), device() or layout() then answer from the
// overrides below, not from the fields.
class PolicyImpl final : public c10::TensorImpl {
 public:
  PolicyImpl(const at::Tensor& like, int policy)
      : c10::TensorImpl(c10::Storage(like.storage()), like.key_set(), like.dtype()) {
    set_sizes_and_strides(like.sizes(), like.strides());
    if (policy == 0) set_custom_sizes_strides(SizesStridesPolicy::CustomSizes);
    if (policy == 1) set_custom_device(true);
    if (policy == 2) set_custom_layout(true);
  }

 protected:
  c10::IntArrayRef sizes_custom() const override { return reported_; }
  int64_t dim_custom() const override { return static_cast<int64_t>(reported_.size()); }
  c10::Device device_custom() const override { return c10::Device(c10::kMeta); }
  c10::Layout layout_custom() const override { return c10::kSparse; }

 private:
  std::vector<int64_t> reported_ = {9, 9};
};

// Word records accept exactly what the accessor records accept, for every property they read:
// key set, dtype, device, sizes (inline and out-of-line), rank, requires_grad with and without
// autograd metadata, the undefined tensor and non-tensors.
TEST(HitCheck, WordRecordsAgreeWithTheProgram) {
  ASSERT_TRUE(HitCheck::WordRecordsSupported()) << "this LibTorch's TensorImpl layout has no word records";
  const at::Tensor s = torch::tensor(1.5f), v = torch::zeros({7}), m = torch::zeros({3, 4}),
                   q = torch::zeros({2, 3, 4, 5});
  std::vector<Guard> guards = {Count(4)};
  for (const auto& [arg, t] : std::vector<std::pair<int, at::Tensor>>{{0, s}, {1, v}, {2, m}, {3, q}}) {
    for (const Guard& g : UsedPlainTensor(arg, t)) guards.push_back(g);
  }
  const HitCheck hit(guards);
  EXPECT_EQ(hit.num_word_records(), 4u);
  EXPECT_EQ(hit.num_tensor_records(), 4u);
  EXPECT_EQ(hit.rest().size(), 0u);

  const at::Tensor wants_grad = torch::zeros({3, 4}, torch::requires_grad());
  at::Tensor grad_off = torch::zeros({3, 4});
  grad_off.set_requires_grad(true);
  grad_off.set_requires_grad(false);  // autograd metadata that says no
  const at::Tensor six = torch::zeros({2, 3, 4, 5, 1, 1});  // sizes out of line
  const at::Tensor on_cpu0 = torch::zeros({3, 4}, torch::Device("cpu:0"));
  at::Tensor inference;
  {
    c10::InferenceMode guard;
    inference = torch::zeros({3, 4});
  }
  std::vector<Args> passing = {{s, v, m, q},
                               {torch::tensor(-2.0f), torch::ones({7}), torch::ones({3, 4}), torch::ones({2, 3, 4, 5})},
                               {s, v, m.view({3, 4}), q},             // a view: autograd metadata
                               {s, v, wants_grad.detach(), q},        // detached: metadata, no grad
                               {s, v, grad_off, q},
                               {s, v, torch::zeros({4, 3}).t(), q}};  // strides are not guarded here
  std::vector<Args> failing = {{s, v, torch::zeros({3, 5}), q},
                               {s, v, torch::zeros({2, 4}), q},
                               {s, torch::zeros({6}), m, q},
                               {s, v, m, torch::zeros({2, 3, 4, 6})},
                               {s, v, m, torch::zeros({1, 3, 4, 5})},
                               {torch::zeros({1}), v, m, q},               // rank 1 for rank 0
                               {s, v, torch::zeros({3, 4, 1}), q},         // rank
                               {s, v, torch::zeros({12}), q},              // rank
                               {s, v, m, six},                             // rank, out-of-line sizes
                               {s, v, torch::zeros({3, 4}, torch::kDouble), q},
                               {s, v, torch::zeros({3, 4}, torch::kInt), q},
                               {torch::tensor(1.5, torch::kDouble), v, m, q},
                               {s, v, torch::empty({3, 4}, torch::TensorOptions().device(torch::kMeta)), q},
                               {s, v, torch::zeros({3, 4}).to_sparse(), q},
                               {s, v, wants_grad, q},
                               {s, v, inference, q},                       // key set
                               {s, v, at::Tensor(), q},
                               {s, v, int64_t{3}, q},
                               {s, v, 2.0, q}};
  (DeviceCodeOf(on_cpu0) == DeviceCodeOf(m) ? passing : failing).push_back({s, v, on_cpu0, q});
  ExpectAgreement({"word records", guards, passing, failing});
}

// Note [Argument identity]: an all-distinct identity guard over n records is checked in the
// record loop, pairwise up to 8 and in a table of 256 / 512 / 1024 slots up to 16 / 32 / 64
// records (beyond, after the records). Random draws from a pool of tensors give many table
// layouts, so home-slot collisions (and a repeat found only by probing past them) occur; every
// draw, distinct or with one repeated tensor, must agree with Holds(). Mixed ranks put the records
// in different rank loops, and every third argument has no dispatch-key guard (an accessor record).
TEST(HitCheck, IdentityInTheRecordLoopAgreesForManyLayouts) {
  std::vector<at::Tensor> pool;
  for (int i = 0; i < 300; ++i) pool.push_back(torch::zeros(std::vector<int64_t>(static_cast<size_t>(i % 3), 2)));
  std::mt19937 rng(7);
  for (int n : {5, 8, 9, 16, 17, 32, 33, 64, 65}) {
    SCOPED_TRACE(testing::Message() << n << " arguments");
    for (int trial = 0; trial < 40; ++trial) {
      // n distinct tensors of the pool, each of rank (its pool index % 3).
      std::vector<int> order(pool.size());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      Args distinct;
      for (int i = 0; i < n; ++i) distinct.push_back(pool[order[i]]);
      std::vector<Guard> guards = {Count(n)};
      for (int a = 0; a < n; ++a) {
        const at::Tensor& t = distinct[a].toTensor();
        for (const Guard& g : a % 3 == 2 ? UsedTensor(a, t) : UsedPlainTensor(a, t)) guards.push_back(g);
      }
      Guard id = Make(GuardKind::kArgIdentity);
      id.same_as = IdentityOf(distinct);
      guards.push_back(id);
      // A repeat: argument j passes argument i's tensor (same rank, so only identity differs).
      std::vector<Args> failing;
      for (int k = 0; k < 4; ++k) {
        const int i = static_cast<int>(rng() % n);
        int j = static_cast<int>(rng() % n);
        for (int step = 0; step < n && (j == i || order[j] % 3 != order[i] % 3); ++step) j = (j + 1) % n;
        if (j == i || order[j] % 3 != order[i] % 3) continue;
        Args repeated = distinct;
        repeated[j] = distinct[i];
        failing.push_back(repeated);
      }
      Args shuffled_pool = distinct;  // other tensors of the same ranks: still distinct
      for (int a = 0; a < n; ++a) shuffled_pool[a] = torch::zeros(distinct[a].toTensor().sizes());
      ExpectAgreement({"identity", guards, {distinct, shuffled_pool}, failing});
      const HitCheck hit(guards);
      if (HitCheck::WordRecordsSupported() && trial == 0) EXPECT_GT(hit.num_word_records(), 0u);
      EXPECT_EQ(hit.record_identity(), n <= 8    ? HitCheck::kPairwiseRecordIdentity
                                       : n <= 64 ? HitCheck::kHashedRecordIdentity
                                                 : HitCheck::kNoRecordIdentity);
    }
  }
}

// A TensorImpl whose sizes, device or layout come from a policy (a subclass's overrides) has
// fields that need not be the truth: word records reject it, whatever the fields hold (the slow
// path's program, which asks the accessors, decides such calls).
TEST(HitCheck, WordRecordsRejectCustomPolicies) {
  const at::Tensor m = torch::zeros({3, 4});
  std::vector<Guard> guards = {Count(1)};
  for (const Guard& g : UsedPlainTensor(0, m)) guards.push_back(g);
  const HitCheck hit(guards);
  ASSERT_EQ(hit.num_word_records(), 1u);
  EXPECT_TRUE(hit.Check({m}));
  for (int policy = -1; policy < 3; ++policy) {
    const at::Tensor t(c10::make_intrusive<PolicyImpl>(m, policy));
    EXPECT_EQ(hit.Check({t}), policy < 0) << "policy " << policy;
  }
}

// --- Ordering -----------------------------------------------------------------------------------

// The guards a builder would emit for one 2-D float tensor argument, deliberately listed most
// expensive first: the program must reorder them.
std::vector<Guard> TensorGuardsReversed() {
  return {
      Make(GuardKind::kStride, 0, 1, /*dim=*/1),
      Make(GuardKind::kStride, 0, 4, /*dim=*/0),
      Make(GuardKind::kSize, 0, 4, /*dim=*/1),
      Make(GuardKind::kSize, 0, 3, /*dim=*/0),
      Make(GuardKind::kRank, 0, 2),
      Make(GuardKind::kRequiresGrad, 0, 0),
      Make(GuardKind::kLayout, 0, static_cast<int64_t>(c10::kStrided)),
      Make(GuardKind::kDevice, 0, DeviceCodeOf(torch::zeros({1}))),
      Make(GuardKind::kDtype, 0, static_cast<int64_t>(at::kFloat)),
      Type(0, ArgType::kTensor),
      Count(1),
  };
}

TEST(GuardProgram, OrdersGuardsCheapestFirst) {
  const GuardProgram program(TensorGuardsReversed());
  ASSERT_EQ(program.size(), 11u);
  const std::vector<Guard>& g = program.guards();
  ASSERT_EQ(g.size(), 11u);
  for (size_t i = 1; i < g.size(); ++i) {
    EXPECT_LE(g[i - 1].kind, g[i].kind) << "at " << i;
  }
  EXPECT_EQ(g.front().kind, GuardKind::kArgCount);
  EXPECT_EQ(g[1].kind, GuardKind::kArgType);
  // Within a kind, by dim.
  EXPECT_EQ(g[7].kind, GuardKind::kSize);
  EXPECT_EQ(g[7].dim, 0);
  EXPECT_EQ(g[8].dim, 1);
  EXPECT_EQ(g[9].kind, GuardKind::kStride);
  EXPECT_EQ(g[9].dim, 0);
  EXPECT_TRUE(program.Check({torch::zeros({3, 4})}));
}

TEST(GuardProgram, WrongTypeOrCountNeverReachesTensorChecks) {
  const GuardProgram program(TensorGuardsReversed());
  // Each of these would read sizes of a non-tensor (or past the rank, or past the argument list)
  // if the size or stride checks ran first.
  const std::vector<Args> bad = {
      {int64_t{3}},
      {2.0},
      {true},
      {at::Tensor()},
      {c10::IValue()},
      {c10::IValue(std::string("not a tensor"))},
      {},
      {torch::zeros({3})},          // rank 1: size(1) does not exist
      {torch::zeros({3, 4, 5})},    // rank 3
      {torch::zeros({3, 4}), int64_t{1}},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_FALSE(program.Check(bad[i])) << "input #" << i;
    EXPECT_NE(program.FirstFailure(bad[i], {}), "") << "input #" << i;
  }
  EXPECT_EQ(program.FirstFailure({int64_t{3}}, {"x"}),
            "expected type of 'x' to be Tensor, but found Int");
  EXPECT_EQ(program.FirstFailure({}, {"x"}), "argument count mismatch. expected 1, actual 0");
  EXPECT_EQ(program.FirstFailure({torch::zeros({3})}, {"x"}),
            "tensor 'x' rank mismatch. expected 2, actual 1");
}

TEST(GuardProgram, FirstFailureReportsTheFirstFailingGuardInEvaluationOrder) {
  const GuardProgram program(TensorGuardsReversed());
  // Both sizes wrong: the dim-0 reason comes first although its guard was listed later.
  EXPECT_EQ(program.FirstFailure({torch::zeros({5, 6})}, {"x"}),
            "tensor 'x' size mismatch at index 0. expected 3, actual 5");
  // Only the second size wrong.
  EXPECT_EQ(program.FirstFailure({torch::zeros({3, 6})}, {"x"}),
            "tensor 'x' size mismatch at index 1. expected 4, actual 6");
  // Wrong dtype and wrong sizes: dtype is checked first.
  EXPECT_EQ(program.FirstFailure({torch::zeros({5, 6}, torch::kDouble)}, {"x"}),
            "tensor 'x' dtype mismatch. expected Float, actual Double");
  // Right sizes, wrong strides.
  EXPECT_EQ(program.FirstFailure({torch::zeros({4, 3}).t()}, {"x"}),
            "tensor 'x' stride mismatch at index 0. expected 4, actual 1");
  EXPECT_EQ(program.FirstFailure({torch::zeros({3, 4})}, {"x"}), "");
  // Names default to argN.
  EXPECT_EQ(program.FirstFailure({torch::zeros({5, 4})}, {}),
            "tensor 'arg0' size mismatch at index 0. expected 3, actual 5");
}

TEST(GuardProgram, ArgumentsAreCheckedInOrderWithinAKind) {
  const GuardProgram program({Count(2), Type(1, ArgType::kInt), Type(0, ArgType::kInt),
                              Make(GuardKind::kIntValue, 1, 7), Make(GuardKind::kIntValue, 0, 5)});
  EXPECT_TRUE(program.Check({int64_t{5}, int64_t{7}}));
  EXPECT_EQ(program.FirstFailure({int64_t{6}, int64_t{8}}, {"a", "b"}),
            "scalar 'a' value mismatch. expected 5, actual 6");
  EXPECT_EQ(program.FirstFailure({1.0, 2.0}, {"a", "b"}),
            "expected type of 'a' to be Int, but found Double");
}

TEST(GuardProgram, EmptyProgramPassesEverything) {
  const GuardProgram empty;
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_TRUE(empty.guards().empty());
  EXPECT_TRUE(empty.Check({}));
  EXPECT_TRUE(empty.Check({torch::zeros({1}), int64_t{1}}));
  EXPECT_TRUE(empty.Check(nullptr, 0));
  EXPECT_EQ(empty.FirstFailure({int64_t{1}}, {}), "");
  const GuardProgram also_empty(std::vector<Guard>{});
  EXPECT_TRUE(also_empty.Check({2.0}));
}

TEST(GuardProgram, KeepsProvenance) {
  Guard g = Make(GuardKind::kRank, 0, 1);
  g.provenance = "used by aten::sin at %0";
  const GuardProgram program({Count(1), Type(0, ArgType::kTensor), g});
  EXPECT_EQ(program.guards().back().provenance, "used by aten::sin at %0");
}


// Note [Thread modes]: the thread's dispatch-key words and autocast's dtype, on both paths.
TEST(ThreadStateGuards, DispatchKeysAndAutocastDtype) {
  const std::vector<c10::IValue> args;
  const std::vector<Guard> guards = {Make(GuardKind::kThreadIncludedKeys, -1, 0),
                                     Make(GuardKind::kThreadExcludedKeys, -1, 0)};
  const GuardProgram program(guards);
  const HitCheck hit(guards);
  EXPECT_TRUE(program.Check(args));
  EXPECT_TRUE(hit.Check(args));
  warden::compat::SetAutocastCpuEnabled(true);
  const bool program_under_autocast = program.Check(args);
  const bool hit_under_autocast = hit.Check(args);
  const std::string reason = program.FirstFailure(args, {});
  {
    const GuardProgram dtype({Make(GuardKind::kAutocastDtype, -1, static_cast<int64_t>(at::kBFloat16))});
    EXPECT_TRUE(dtype.Check(args));
  }
  warden::compat::SetAutocastCpuEnabled(false);
  EXPECT_FALSE(program_under_autocast);
  EXPECT_FALSE(hit_under_autocast);
  EXPECT_EQ(reason, "thread-local excluded dispatch keys mismatch. expected default, actual autocast cpu on");
  {
    at::AutoDispatchBelowADInplaceOrView below;
    EXPECT_FALSE(hit.Check(args));
    EXPECT_THAT(program.FirstFailure(args, {}), ::testing::HasSubstr("actual below autograd"));
  }
  const GuardProgram dtype({Make(GuardKind::kAutocastDtype, -1, static_cast<int64_t>(at::kBFloat16))});
  EXPECT_FALSE(dtype.Check(args));
  EXPECT_EQ(dtype.FirstFailure(args, {}), "autocast dtype mismatch. expected BFloat16, actual autocast off");
  EXPECT_EQ(Describe(guards[1], {}), "thread_excluded_keys == default");
}

}  // namespace
}  // namespace warden::guards
