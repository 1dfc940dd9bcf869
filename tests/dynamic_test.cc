// Acceptance scenarios for dynamic shapes through the public API: automatic dynamic, kDynamic,
// mark_dynamic / mark_static, 0/1 specialization, relational guards and their reasons. These are
// the behaviours Dynamo documents for torch.compile(dynamic=None/True/False).
#include <cstdlib>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/warden.h"
#include "tests/sweep.h"

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

warden::Options Mode(warden::Dynamic d, const std::string& name = "fn") {
  warden::Options o;
  o.name = name;
  o.backend = "aten";
  o.dynamic = d;
  return o;
}

std::vector<at::Tensor> AddMul(const std::vector<c10::IValue>& a) {
  return {(a[0].toTensor() + a[1].toTensor()).relu() * 3};
}

using warden::test_util::AutoOn;
using warden::test_util::ExpectSame;
using warden::test_util::SweepFirstDim;


TEST(Dynamic, AutomaticDynamicAfterOneSizeChange) {
  auto f = warden::compile(AddMul, Mode(warden::Dynamic::kAuto));
  auto y = torch::randn({4});
  for (int64_t n : {3, 5, 7, 9, 100, 2}) {
    auto x = torch::randn({n, 4});
    ExpectSame(f({x, y}), AddMul({x, y}));
  }
  EXPECT_EQ(f.stats().compiles, 2);
  auto events = f.recompiles();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].action, "recompiled with arg0.size(0) dynamic");
  EXPECT_THAT(events[0].reasons, ElementsAre("tensor 'arg0' size mismatch at index 0. expected 3, actual 5"));
  EXPECT_THAT(f.guards(1), testing::Contains(HasSubstr("arg0.size(0) >= 2")));
}

TEST(Dynamic, StaticModeCompilesPerSize) {
  auto f = warden::compile(AddMul, Mode(warden::Dynamic::kStatic));
  auto y = torch::randn({4});
  for (int64_t n : {3, 5, 7, 9}) f({torch::randn({n, 4}), y});
  EXPECT_EQ(f.stats().compiles, 4);
}

TEST(Dynamic, SizeOneSpecializes) {
  auto f = warden::compile(AddMul, Mode(warden::Dynamic::kDynamic));
  auto y = torch::randn({4});
  f({torch::randn({3, 4}), y});
  f({torch::randn({6, 4}), y});
  EXPECT_EQ(f.stats().compiles, 1);
  auto x1 = torch::randn({1, 4});
  ExpectSame(f({x1, y}), AddMul({x1, y}));
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_THAT(f.recompiles().at(0).reasons.at(0), "arg0.size(0) >= 2 failed: actual 1");
  auto x0 = torch::randn({0, 4});
  ExpectSame(f({x0, y}), AddMul({x0, y}));
  EXPECT_EQ(f.stats().compiles, 3);
}

TEST(Dynamic, BroadcastRelationGuard) {
  auto f = warden::compile(AddMul, Mode(warden::Dynamic::kDynamic));
  f({torch::randn({3, 4}), torch::randn({3, 4})});
  // Same relation, new sizes: hit.
  auto a = torch::randn({5, 6}), b = torch::randn({5, 6});
  ExpectSame(f({a, b}), AddMul({a, b}));
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().cache_hits, 1);
  const auto g = f.guards(0);
  EXPECT_THAT(g, testing::Contains(HasSubstr("arg1.size(0) == arg0.size(0)  # required by aten::add.Tensor at %0")));
  // Broadcasting the other way (size 1) breaks the relation: recompile, eager semantics.
  auto c = torch::randn({5, 1});
  ExpectSame(f({a, c}), AddMul({a, c}));
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_EQ(f.recompiles().at(0).reasons.at(0),
            "arg1.size(1) == arg0.size(1) failed: 1 vs 6 (required by aten::add.Tensor at %0)");
  // A real mismatch raises what eager raises.
  EXPECT_THROW(f({torch::randn({5, 6}), torch::randn({4, 6})}), c10::Error);
}

// A relation over more symbols than fit the evaluator's stack buffer: the size of a cat of 40
// arguments must equal another argument's (41 symbols). It used to read past a 16-slot array and
// never hit.
std::vector<at::Tensor> CatPlus(const std::vector<c10::IValue>& a) {
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i + 1 < a.size(); ++i) parts.push_back(a[i].toTensor());
  return {torch::cat(parts, 0) + a.back().toTensor()};
}

TEST(Dynamic, RelationOverManySymbols) {
  auto f = warden::compile(CatPlus, Mode(warden::Dynamic::kDynamic));
  auto args_for = [](int64_t first) {
    std::vector<c10::IValue> args;
    int64_t total = 0;
    for (int64_t i = 0; i < 40; ++i) {
      args.push_back(torch::randn({first + i, 3}));
      total += first + i;
    }
    args.push_back(torch::randn({total, 3}));
    return args;
  };
  for (int64_t first : {2, 3, 5, 2}) {
    const auto args = args_for(first);
    ExpectSame(f(args), CatPlus(args));
  }
  EXPECT_EQ(f.stats().compiles, 1) << f.explain();
  EXPECT_EQ(f.stats().cache_hits, 3);
  // A total that does not add up raises as eager does, after a miss.
  auto bad = args_for(2);
  bad.back() = torch::randn({7, 3});
  EXPECT_THROW(f(bad), c10::Error);
}

TEST(Dynamic, RelationFailureReasonNamesTheOp) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {torch::cat({a[0].toTensor(), a[1].toTensor()}, 0) + a[2].toTensor()};
  };
  auto f = warden::compile(fn, Mode(warden::Dynamic::kDynamic));
  f({torch::randn({2, 3}), torch::randn({4, 3}), torch::randn({6, 3})});
  auto x = torch::randn({3, 3}), y = torch::randn({5, 3}), z = torch::randn({8, 3});
  ExpectSame(f({x, y, z}), fn({x, y, z}));
  EXPECT_EQ(f.stats().compiles, 1);
  // z no longer matches the concatenation: the relation fails (then eager raises).
  EXPECT_THROW(f({x, y, torch::randn({9, 3})}), c10::Error);
  ASSERT_EQ(f.recompiles().size(), 1u);
  EXPECT_EQ(f.recompiles()[0].action, "retraced: the function raised an exception (no entry added)");
  EXPECT_THAT(f.recompiles()[0].reasons.at(0),
              testing::MatchesRegex("arg2.size\\(0\\) == .* failed: 9 vs 8 \\(required by aten::add.Tensor at %1\\)"));
}

TEST(Dynamic, MarkDynamicAndMarkStatic) {
  auto f = warden::compile(AddMul, Mode(warden::Dynamic::kStatic));
  f.mark_dynamic(0, 0);
  auto y = torch::randn({4});
  for (int64_t n : {3, 5, 7}) f({torch::randn({n, 4}), y});
  EXPECT_EQ(f.stats().compiles, 1);

  auto g = warden::compile(AddMul, Mode(warden::Dynamic::kDynamic));
  g.mark_static(0, 0);
  auto y6 = torch::randn({6, 4});
  g({torch::randn({6, 4}), y6});
  g({torch::randn({6, 4}), y6});
  EXPECT_EQ(g.stats().compiles, 1);
  EXPECT_THAT(g.guards(0), testing::Contains(HasSubstr("arg0.size(0) == 6")));
}

TEST(Dynamic, BoolFlagTimesSize) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    return {a[1].toBool() ? x.sin() : x.cos()};
  };
  auto f = warden::compile(fn, Mode(warden::Dynamic::kAuto));
  for (bool flag : {true, false}) {
    for (int64_t n : {3, 4, 5, 6}) {
      auto x = torch::randn({n});
      ExpectSame(f({x, flag}), fn({x, flag}));
    }
  }
  // true: static(3) + dynamic; false: one more (the flag is a value guard; the dim is already dynamic).
  EXPECT_EQ(f.stats().compiles, 3);
}

TEST(Dynamic, SizeReadSpecializes) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    return {x.view({x.size(0) * x.size(1)})};
  };
  auto f = warden::compile(fn, Mode(warden::Dynamic::kDynamic));
  f({torch::randn({3, 4})});
  auto x = torch::randn({5, 4});
  ExpectSame(f({x}), fn({x}));
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_THAT(f.guards(0), testing::Contains(HasSubstr("arg0.size(0) == 3  # %arg0.size(0) read by user code")));
}

TEST(Dynamic, SequenceSweepCompilesAtMostThreeTimes) {
  c10::InferenceMode guard;
  const int64_t d = 16;
  auto wq = torch::randn({d, d}), wk = torch::randn({d, d}), wv = torch::randn({d, d});
  auto attn = [&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    auto q = torch::matmul(x, wq), k = torch::matmul(x, wk), v = torch::matmul(x, wv);
    auto s = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / 4.0, -1);
    return {torch::layer_norm(torch::matmul(s, v) + x, {d})};
  };
  auto f = warden::compile(attn, Mode(warden::Dynamic::kAuto));
  for (int64_t n = 1; n <= 64; ++n) {
    auto x = torch::randn({2, n, d});
    ExpectSame(f({x}), attn({x}));
  }
  EXPECT_LE(f.stats().compiles, 3) << f.explain();
}

TEST(Dynamic, CacheLimitUnderAuto) {
  // Under kAuto one size change makes the dim symbolic, so sizes alone cannot fill the cache;
  // dtype changes can. The limit then applies exactly as under kStatic.
  auto o = Mode(warden::Dynamic::kAuto);
  o.cache_size_limit = 3;
  auto f = warden::compile(AddMul, o);
  auto y = torch::randn({4});
  for (int64_t n : {2, 3, 4, 5, 6, 7, 8}) f({torch::randn({n, 4}), y});
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_EQ(f.stats().eager_calls, 0);
  testing::internal::CaptureStderr();
  auto xd = torch::randn({5, 4}, torch::kDouble);
  f({xd, y.to(torch::kDouble)});
  auto xi = torch::randint(0, 5, {5, 4});
  auto yi = torch::randint(0, 5, {4});
  auto out = f({xi, yi});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(torch::equal(out[0], AddMul({xi, yi})[0]));
  EXPECT_EQ(f.stats().compiles, 3);
  EXPECT_EQ(f.stats().eager_calls, 1);
  EXPECT_THAT(err, HasSubstr("warden hit cache_size_limit (3)"));
  EXPECT_EQ(f.recompiles().back().action, "cache_size_limit (3) hit: ran eagerly");
  EXPECT_EQ(f.recompiles().back().reasons.size(), 3u);
}

// Note [Verified size reads]: view({x.size(0), -1}) (as the MNIST example flattens) reads the
// batch size in C++. Over 12 sizes: batch 1 is static, batch 2 generalizes against it (the view's
// size argument becomes arg0.size(0) at run time), every later size is verified by one re-trace,
// no compile; the second round hits everywhere.
TEST(Dynamic, SizeReadByUserCodeIsVerifiedNotRecompiled) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    return {x.relu().view({x.size(0), -1}) * 2};
  };
  for (const char* backend : {"aten", "cpp"}) {
    SCOPED_TRACE(backend);
    auto f = warden::compile(fn, AutoOn(backend));
    SweepFirstDim(f, fn, 12, {2, 3});
    const warden::Stats s = f.stats();
    EXPECT_EQ(s.compiles, 2);
    EXPECT_EQ(s.size_verifications, 10);
    EXPECT_EQ(s.eager_calls, 0);
    EXPECT_EQ(s.cache_hits, 12);
    const auto events = f.recompiles();
    ASSERT_EQ(events.size(), 11u);
    EXPECT_THAT(events[0].action, HasSubstr("arg0.size(0) read by C++: verified per value by re-tracing"));
    EXPECT_THAT(events[1].action, testing::MatchesRegex("verified arg0.size\\(0\\)=3 against entry [0-9]+/1 "
                                                        "\\(re-trace [0-9.]+ ms, no compile\\)"));
    EXPECT_THAT(events[1].reasons.at(0), HasSubstr("arg0.size(0)=3 is read by C++ code and not yet verified"));
    EXPECT_THAT(f.explain(), HasSubstr("arg0.size(0) in {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}"));
    EXPECT_THAT(f.explain(), HasSubstr("aten::view(%0, [%arg0.size(0), -1])"));
  }
}

// The size a verification records is the one the call began with: a function that transposes
// its argument in place after reading its size must not get the transposed size verified (that
// size was never traced, and here the function branches on it).
TEST(Dynamic, VerifiedSizeIsTheSizeAtEntry) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    if (x.size(0) == 4) return {x.view({4, -1}) * 100};
    at::Tensor y = x.view({x.size(0), -1}) * 2;
    x.t_();
    return {y};
  };
  auto f = warden::compile(fn, Mode(warden::Dynamic::kAuto));
  for (int64_t n : {2, 3, 5}) {
    auto x = torch::randn({n, 4});
    auto x2 = x.clone();
    ExpectSame(f({x}), fn({x2}));
    EXPECT_TRUE(torch::equal(x, x2));
  }
  EXPECT_EQ(f.stats().size_verifications, 1);
  auto x = torch::randn({4, 4});
  auto x2 = x.clone();
  ExpectSame(f({x}), fn({x2}));  // size 4 was never traced: re-traced, not replayed
}

// A multiple of a read size (x.size(0) * 2, as nn::MultiheadAttention computes batch * heads) is
// verified like the size itself: the argument becomes arg0.size(0)*2 at run time, one compile per
// entry, every later size one re-trace. The re-trace is the proof: a function whose multiple
// changes with the size (here 2 below 7, 3 from 7 on) fails verification there and recompiles,
// with results equal to eager throughout.
TEST(Dynamic, MultipleOfAReadSizeIsVerified) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    const int64_t k = x.size(0) < 7 ? 2 : 3;
    return {x.relu().reshape({x.size(0) * k, -1}) + 1};
  };
  for (const char* backend : {"aten", "cpp"}) {
    SCOPED_TRACE(backend);
    auto f = warden::compile(fn, AutoOn(backend));
    SweepFirstDim(f, fn, 6, {6, 2});
    EXPECT_EQ(f.stats().compiles, 2);
    EXPECT_EQ(f.stats().size_verifications, 4);
    EXPECT_EQ(f.stats().eager_calls, 0);
    EXPECT_EQ(f.stats().cache_hits, 6);
    EXPECT_THAT(f.explain(), HasSubstr("[%arg0.size(0)*2, -1]"));
    for (int64_t n : {7, 8, 9}) {
      auto x = torch::randn({n, 6, 2});
      ExpectSame(f({x}), fn({x}));
    }
    EXPECT_EQ(f.stats().eager_calls, 0);
    EXPECT_GE(f.stats().compiles, 3);
    EXPECT_THAT(f.recompiles().at(5).reasons.at(0), HasSubstr("arg0.size(0)=7 is read by C++ code and not yet verified"));
  }
}

// C++ that reads strides (is_contiguous(), as nn::MultiheadAttention's contiguous() does) has the
// strides of every argument verified with the sizes, per value: here the function branches on
// the parity of a stride, so a width on the other side re-traces, sees the branch and recompiles,
// and a transposed argument of a verified width (same sizes, other strides) is verified before
// anything replays.
TEST(Dynamic, StrideReadIsVerifiedPerValue) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    if (x.stride(0) % 2 == 0) return {x * 2};
    return {x.exp() * 3};
  };
  for (const char* backend : {"aten", "cpp"}) {
    SCOPED_TRACE(backend);
    auto f = warden::compile(fn, AutoOn(backend));
    for (int64_t n : {4, 6, 8, 5, 7, 10, 5}) {
      SCOPED_TRACE(n);
      auto x = torch::randn({2, n});
      ExpectSame(f({x}), fn({x}));
    }
    EXPECT_EQ(f.stats().eager_calls, 0);
    EXPECT_EQ(f.stats().size_verifications, 2);  // widths 8 and 10
    EXPECT_THAT(f.explain(), HasSubstr("sizes and strides read by C++, verified per value by re-tracing: "
                                       "(arg0.size(1), arg0.stride(0), arg0.stride(1)) in {(6, 6, 1), (8, 8, 1), (10, 10, 1)}"));
    auto t = torch::randn({8, 2}).t();  // sizes [2, 8] as verified, strides [1, 2]
    ExpectSame(f({t}), fn({t}));
    EXPECT_EQ(f.stats().eager_calls, 0);
  }
}

// A size read that feeds a value computed from it that is not a multiple of it (x.size(0) + 1)
// cannot be expressed: the dim stays static, each recompile says why, and the cache-limit warning
// names the function by its default name and says what would have avoided it.
TEST(Dynamic, DerivedSizeReadStaysStaticAndSaysWhy) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    return {x.relu().reshape({x.size(0) + 1, -1})};
  };
  warden::Options o = Mode(warden::Dynamic::kAuto);
  o.name = warden::Options().name;  // the default name
  o.cache_size_limit = 3;
  auto f = warden::compile(fn, o);
  testing::internal::CaptureStderr();
  for (int64_t n : {2, 3, 4, 5}) {
    auto x = torch::randn({n, n + 1});
    ExpectSame(f({x}), fn({x}));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(f.stats().compiles, 3);
  EXPECT_EQ(f.stats().eager_calls, 1);
  const auto events = f.recompiles();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_THAT(events[0].action, HasSubstr("recompiled; arg0.size(0) stays static: "));
  EXPECT_THAT(events[0].action, HasSubstr("element 0 of argument 1 of aten::reshape at %1 changes but is not a size "
                                          "C++ read (computed from one?)"));
  EXPECT_THAT(err, HasSubstr("function: 'fn#"));
  EXPECT_THAT(err, HasSubstr("dims that could not become dynamic: arg0.size(0) stays static: "));
  EXPECT_THAT(err, HasSubstr("view({-1, n})"));
  // The same code written without the read stays dynamic.
  auto g = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> { return {a[0].toTensor().relu().flatten(1)}; },
      Mode(warden::Dynamic::kAuto));
  for (int64_t n : {2, 3, 4, 5}) g({torch::randn({n, 2, 3})});
  EXPECT_EQ(g.stats().compiles, 2);
}

// TORCH_CHECK(x.size(0) == y.size(0)) reads both sizes and relates them in C++ only: 12 sizes
// cost at most two compiles, and a mismatching pair still raises (its re-trace runs the check).
TEST(Dynamic, UserShapeCheckIsVerifiedAndStillRaises) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    const at::Tensor& y = a[1].toTensor();
    TORCH_CHECK(x.size(0) == y.size(0), "batch sizes differ: ", x.size(0), " vs ", y.size(0));
    return {x * 2, y.exp()};
  };
  auto f = warden::compile(fn, Mode(warden::Dynamic::kAuto));
  for (int64_t n = 1; n <= 12; ++n) {
    auto x = torch::randn({n, 3}), y = torch::randn({n, 4});
    ExpectSame(f({x, y}), fn({x, y}));
  }
  EXPECT_LE(f.stats().compiles, 2);
  EXPECT_EQ(f.stats().eager_calls, 0);
  EXPECT_THROW(f({torch::randn({5, 3}), torch::randn({6, 4})}), c10::Error);
  EXPECT_THROW(f({torch::randn({7, 3}), torch::randn({3, 4})}), c10::Error);
  auto x = torch::randn({9, 3}), y = torch::randn({9, 4});
  ExpectSame(f({x, y}), fn({x, y}));  // still a hit after the failures
}

// A C++ branch on a read size is seen by the verification trace: a size on the other side of
// the branch does not verify (different graph) and recompiles; results always equal eager.
TEST(Dynamic, BranchOnAReadSizeIsSeenByVerification) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    if (x.size(0) > 8) return {x * 2};
    return {x * 3};
  };
  auto f = warden::compile(fn, Mode(warden::Dynamic::kAuto));
  for (int round = 0; round < 2; ++round) {
    for (int64_t n = 1; n <= 12; ++n) {
      auto x = torch::randn({n, 3});
      ExpectSame(f({x}), fn({x}));
    }
  }
  EXPECT_LE(f.stats().compiles, 4);
  EXPECT_EQ(f.stats().eager_calls, 0);
}

// mark_dynamic on a dim that cannot become symbolic warns once, naming the reason; on a dim C++
// reads as is (view({x.size(0), -1})) it is honored from the second size on, without a warning.
TEST(Dynamic, MarkDynamicThatCannotBeHonoredWarnsOnce) {
  auto derived = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    return {x.reshape({x.size(0) + 3, -1})};
  };
  auto f = warden::compile(derived, Mode(warden::Dynamic::kStatic, "reader"));
  f.mark_dynamic(0, 0);
  testing::internal::CaptureStderr();
  for (int64_t n : {2, 3, 4, 5}) f({torch::randn({n, n + 3})});
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("warden: function 'reader': mark_dynamic(0, 0) is not honored: arg0.size(0) stays static ("));
  EXPECT_EQ(err.find("mark_dynamic(0, 0)"), err.rfind("mark_dynamic(0, 0)")) << "warned twice: " << err;
  EXPECT_THAT(f.recompiles().at(0).action, HasSubstr("arg0.size(0) stays static"));
  EXPECT_EQ(f.stats().compiles, 4);

  auto plain = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    return {x.view({x.size(0), -1})};
  };
  auto g = warden::compile(plain, Mode(warden::Dynamic::kStatic, "plain"));
  g.mark_dynamic(0, 0);
  testing::internal::CaptureStderr();
  for (int64_t n : {2, 3, 4, 5}) g({torch::randn({n, 3})});
  err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("not honored"), std::string::npos) << err;
  EXPECT_EQ(g.stats().compiles, 2);
  EXPECT_EQ(g.stats().size_verifications, 2);
}

// Options::capture_scalar_outputs: an item() whose value only scales a tensor is a graph value.
// 30 calls, each with a new value: one compile, every other call a hit, results equal eager's.
// Without the option, every new value is a recompile (the value guard fails).
TEST(Dynamic, CaptureScalarOutputsKeepsItemValuesInTheGraph) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    const double scale = x.abs().max().item<double>();
    return {(x / scale).tanh() * scale};
  };
  for (const char* backend : {"aten", "cpp"}) {
    SCOPED_TRACE(backend);
    warden::Options o = Mode(warden::Dynamic::kAuto, "scaled");
    o.backend = backend;
    o.capture_scalar_outputs = true;
    auto f = warden::compile(fn, o);
    for (int i = 0; i < 30; ++i) {
      auto x = torch::randn({8});
      ExpectSame(f({x}), fn({x}));
    }
    EXPECT_LE(f.stats().compiles, 2);
    EXPECT_EQ(f.stats().eager_calls, 0);
    EXPECT_THAT(f.explain(), HasSubstr("is a graph value (no value guard)"));
  }
  warden::Options plain = Mode(warden::Dynamic::kAuto, "plain");
  plain.cache_size_limit = 30;
  auto g = warden::compile(fn, plain);
  for (int i = 0; i < 5; ++i) g({torch::randn({8})});
  EXPECT_EQ(g.stats().compiles, 5);
}

// What the check catches: a branch on the value (the perturbed value takes the other side), a
// value that decides a shape, a value C++ transforms before an op sees it. Each keeps its value
// guard, says why in explain(), and results stay right.
TEST(Dynamic, CaptureScalarOutputsKeepsTheGuardWhereTheValueIsNotJustAnArgument) {
  auto branch = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    const double m = x.mean().item<double>();
    return {m > 0.6 ? x * 2 : x * 3};
  };
  auto shape = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    return {torch::ones({x.sum().item<int64_t>()})};
  };
  auto derived = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    return {x * (x.max().item<double>() * 2)};
  };
  warden::Options o = Mode(warden::Dynamic::kAuto, "checked");
  o.capture_scalar_outputs = true;
  {
    auto f = warden::compile(branch, o);
    for (double v : {0.5, 0.55, 0.7, 0.58}) {
      auto x = torch::full({4}, v);
      ExpectSame(f({x}), branch({x}));
    }
    EXPECT_THAT(f.explain(), HasSubstr("stays value-guarded: "));
  }
  {
    auto f = warden::compile(shape, o);
    for (int64_t n : {2, 3, 2}) {
      auto x = torch::tensor({n, int64_t{0}});
      ExpectSame(f({x}), shape({x}));
    }
    EXPECT_THAT(f.explain(), HasSubstr("stays value-guarded"));
  }
  {
    auto f = warden::compile(derived, o);
    for (int i = 0; i < 3; ++i) {
      auto x = torch::randn({4});
      ExpectSame(f({x}), derived({x}));
    }
    EXPECT_THAT(f.explain(), HasSubstr("stays value-guarded: argument 1 of aten::mul.Scalar"));
    EXPECT_EQ(f.stats().compiles, 3);
  }
}

TEST(Dynamic, ScalarArgumentsStaySpecializedUnderAuto) {
  // C++ scalars cannot be made symbolic soundly (branches on them are invisible to the tracer):
  // each value is its own entry, with the value in the reason.
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() * a[1].toDouble()};
  };
  auto f = warden::compile(fn, Mode(warden::Dynamic::kAuto));
  auto x = torch::randn({3});
  for (double v : {0.5, 1.5, 2.5}) ExpectSame(f({x, v}), fn({x, v}));
  EXPECT_EQ(f.stats().compiles, 3);
  EXPECT_EQ(f.recompiles().at(0).reasons.at(0), "scalar 'arg1' value mismatch. expected 0.5, actual 1.5");
  EXPECT_EQ(f.recompiles().at(0).action, "recompiled");
}

TEST(Dynamic, MatmulInnerDimsRelation) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {torch::matmul(a[0].toTensor(), a[1].toTensor())};
  };
  auto f = warden::compile(fn, Mode(warden::Dynamic::kDynamic));
  f({torch::randn({3, 4}), torch::randn({4, 5})});
  auto a = torch::randn({6, 7}), b = torch::randn({7, 2});
  ExpectSame(f({a, b}), fn({a, b}));
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_THAT(f.guards(0), testing::Contains(HasSubstr("arg1.size(0) == arg0.size(1)  # required by aten::matmul at %0")));
  // No duck sizing: equal but unrelated dims get no relation.
  for (const std::string& g : f.guards(0)) EXPECT_THAT(g, testing::Not(HasSubstr("arg1.size(1) == arg0.size(0)")));
}

TEST(Dynamic, ReshapeSolvesMinusOneSymbolically) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor().reshape({-1, 4}).sum(1)};
  };
  auto f = warden::compile(fn, Mode(warden::Dynamic::kDynamic));
  f({torch::randn({3, 8})});
  auto x = torch::randn({5, 8});
  ExpectSame(f({x}), fn({x}));
  EXPECT_EQ(f.stats().compiles, 1) << f.explain();
  // Only the dim the division needed became static.
  EXPECT_THAT(f.guards(0), testing::Contains(HasSubstr("arg0.size(0) >= 2")));
  EXPECT_THAT(f.guards(0), testing::Contains(HasSubstr("arg0.size(1) == 8  # specialized by aten::reshape at %0")));
  auto y = torch::randn({5, 6});  // 30 elements: not a multiple of 4 -> eager raises
  EXPECT_THROW(f({y}), std::exception);
}

// Note [Symbolic scalars]: mark_dynamic on an int/double argument the caller vouches is used only
// as an op argument. Each case runs on both backends.
class SymbolicScalar : public ::testing::TestWithParam<const char*> {
 protected:
  warden::Options Opts() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    setenv("WARDEN_CACHE_DIR", (std::string(tmp != nullptr ? tmp : "/tmp") + "/warden-dynamic").c_str(), 1);
    warden::Options o = Mode(warden::Dynamic::kAuto);
    o.backend = GetParam();
    o.arg_names = {"x", "alpha"};
    return o;
  }
};

std::vector<at::Tensor> ScaleShift(const std::vector<c10::IValue>& a) {
  const at::Tensor& x = a[0].toTensor();
  return {torch::add(x * a[1].toScalar(), x.tanh(), a[1].toScalar())};
}

TEST_P(SymbolicScalar, OneCompileForEveryValue) {
  auto f = warden::compile(ScaleShift, Opts());
  f.mark_dynamic(1, 0);
  auto x = torch::randn({8});
  for (double alpha : {2.0, 3.0, -0.5, 0.0, 1e6}) ExpectSame(f({x, alpha}), ScaleShift({x, alpha}));
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().cache_hits, 4);
  const std::string text = f.explain();
  EXPECT_THAT(text, HasSubstr("%alpha: float (symbolic)"));
  EXPECT_THAT(text, HasSubstr("aten::mul.Scalar(%x, %alpha)"));
  EXPECT_THAT(f.guards(0), testing::Contains(HasSubstr("type(alpha) == Double")));
  EXPECT_THAT(f.guards(0), testing::Not(testing::Contains(HasSubstr("alpha =="))));
  // The type is still guarded: an int is a new entry (type promotion may differ).
  ExpectSame(f({x, int64_t{2}}), ScaleShift({x, 2.0}));
  EXPECT_EQ(f.stats().compiles, 2);
}

TEST_P(SymbolicScalar, IntArgument) {
  auto f = warden::compile([](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
                             return {a[0].toTensor().add(a[1].toInt()).mul(a[1].toInt())};
                           }, Opts());
  f.mark_dynamic(1, 0);
  auto x = torch::arange(6);
  for (int64_t n : {3, 4, -7, 0}) {
    auto got = f({x, n});
    EXPECT_TRUE(torch::equal(got[0], x.add(n).mul(n))) << n;
    EXPECT_EQ(got[0].scalar_type(), at::kLong);
  }
  EXPECT_EQ(f.stats().compiles, 1);
}

TEST_P(SymbolicScalar, BranchOnTheValueKeepsItSpecialized) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const double alpha = a[1].toDouble();
    at::Tensor y = a[0].toTensor() * alpha;
    return {alpha > 2.5 ? y.relu() : y};  // invisible to the tracer
  };
  auto f = warden::compile(fn, Opts());
  f.mark_dynamic(1, 0);
  auto x = torch::randn({8});
  // At 2.0 the second trace (at 3.0) takes the other branch: alpha stays specialized, and is not
  // tried again at 3.0 (where a second trace at 4.25 would not cross the branch).
  for (double alpha : {2.0, 3.0, 2.0, 3.0}) ExpectSame(f({x, alpha}), fn({x, alpha}));
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_THAT(f.explain(), HasSubstr("scalar: alpha stays specialized: the function records different ops"));
  EXPECT_THAT(f.guards(1), testing::Contains(HasSubstr("alpha == 3")));
}

TEST_P(SymbolicScalar, DerivedValueKeepsItSpecialized) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() * (a[1].toDouble() * 2)};
  };
  auto f = warden::compile(fn, Opts());
  f.mark_dynamic(1, 0);
  auto x = torch::randn({8});
  for (double alpha : {2.0, 3.0}) ExpectSame(f({x, alpha}), fn({x, alpha}));
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_THAT(f.explain(), HasSubstr("changes with it but is not its value"));
}

TEST_P(SymbolicScalar, UnusedOrStatefulKeepsItSpecialized) {
  auto only_cpp = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {a[1].toDouble() > 0 ? a[0].toTensor().relu() : a[0].toTensor().neg()};
  };
  auto f = warden::compile(only_cpp, Opts());
  f.mark_dynamic(1, 0);
  auto x = torch::randn({8});
  for (double alpha : {1.0, 2.0, -1.0}) ExpectSame(f({x, alpha}), only_cpp({x, alpha}));
  EXPECT_EQ(f.stats().compiles, 3);
  EXPECT_THAT(f.explain(), HasSubstr("no op takes it as an argument"));

  auto in_place = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor().add_(a[1].toDouble())};
  };
  auto g = warden::compile(in_place, Opts());
  g.mark_dynamic(1, 0);
  auto y = torch::zeros({4});
  g({y, 1.0});
  g({y, 2.0});
  EXPECT_TRUE(torch::equal(y, torch::full({4}, 3.0)));  // the function ran once per call
  EXPECT_EQ(g.stats().compiles, 2);
  EXPECT_THAT(g.explain(), HasSubstr("the graph writes a tensor or draws random numbers"));
}

TEST_P(SymbolicScalar, ThrowingProbeKeepsItSpecialized) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor().select(0, a[1].toInt())};  // index 3 is valid, 4 (the probe) is not
  };
  auto f = warden::compile(fn, Opts());
  f.mark_dynamic(1, 0);
  auto x = torch::randn({4, 2});
  ExpectSame(f({x, int64_t{3}}), fn({x, int64_t{3}}));
  ExpectSame(f({x, int64_t{1}}), fn({x, int64_t{1}}));
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_THAT(f.explain(), HasSubstr("alpha stays specialized: the function raised with alpha = 4"));
}

INSTANTIATE_TEST_SUITE_P(Backends, SymbolicScalar, ::testing::Values("aten", "cpp"));

}  // namespace
