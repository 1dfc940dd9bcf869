// Acceptance scenarios through the public API only (runtime/warden.h), mirroring behaviours
// PyTorch users know from torch.compile: recompiles with exact reasons, cache limits, mutation,
// unused arguments, results equal to eager.
#include <chrono>
#include <cmath>
#include <fstream>
#include <sys/stat.h>
#include <cstdlib>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/warden.h"

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

warden::Options Static(const std::string& name = "fn") {
  warden::Options o;
  o.name = name;
  o.backend = "aten";
  o.dynamic = warden::Dynamic::kStatic;
  return o;
}

std::vector<at::Tensor> AddRelu(const std::vector<c10::IValue>& a) {
  return {torch::relu(a[0].toTensor() + a[1].toTensor()) * 2};
}

void ExpectSame(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].defined(), want[i].defined());
    if (!want[i].defined()) continue;
    EXPECT_EQ(got[i].scalar_type(), want[i].scalar_type()) << "output " << i;
    EXPECT_EQ(got[i].sizes(), want[i].sizes()) << "output " << i;
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-5, 1e-6, /*equal_nan=*/true)) << "output " << i;
  }
}

TEST(Acceptance, HitAfterFirstCompileAndEqualsEager) {
  auto f = warden::compile(AddRelu, Static());
  auto x = torch::randn({3, 4}), y = torch::randn({4});
  for (int i = 0; i < 3; ++i) {
    x = torch::randn({3, 4});
    ExpectSame(f({x, y}), AddRelu({x, y}));
  }
  auto s = f.stats();
  EXPECT_EQ(s.calls, 3);
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.cache_hits, 2);
  EXPECT_EQ(s.eager_calls, 0);
  EXPECT_TRUE(f.recompiles().empty());
}

TEST(Acceptance, HitDoesNotCallUserCode) {
  int calls = 0;
  auto f = warden::compile(
      [&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        ++calls;
        return {a[0].toTensor().sin()};
      },
      Static());
  auto x = torch::randn({5});
  f({x});
  f({x});
  f({torch::randn({5})});
  EXPECT_EQ(calls, 1);
}

TEST(Acceptance, SizeChangeRecompilesWithExactReason) {
  auto f = warden::compile(AddRelu, Static());
  f({torch::randn({3, 4}), torch::randn({4})});
  auto x = torch::randn({5, 4}), y = torch::randn({4});
  ExpectSame(f({x, y}), AddRelu({x, y}));
  auto events = f.recompiles();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].call_index, 1);
  EXPECT_THAT(events[0].reasons, ElementsAre("tensor 'arg0' size mismatch at index 0. expected 3, actual 5"));
  EXPECT_EQ(events[0].action, "recompiled");
  EXPECT_EQ(f.stats().compiles, 2);
  // Both sizes now hit.
  f({torch::randn({3, 4}), y});
  f({torch::randn({5, 4}), y});
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_EQ(f.stats().cache_hits, 2);
}

TEST(Acceptance, ReasonsListEveryEntryMostRecentFirst) {
  auto f = warden::compile(AddRelu, Static());
  auto y = torch::randn({4});
  f({torch::randn({2, 4}), y});
  f({torch::randn({3, 4}), y});
  f({torch::randn({2, 4}), y});  // hit entry 0: now most recent
  f({torch::randn({7, 4}), y});
  auto events = f.recompiles();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_THAT(events[1].reasons,
              ElementsAre("tensor 'arg0' size mismatch at index 0. expected 2, actual 7",
                          "tensor 'arg0' size mismatch at index 0. expected 3, actual 7"));
}

TEST(Acceptance, DtypeChangeRecompiles) {
  auto f = warden::compile(AddRelu, Static());
  f({torch::randn({3}), torch::randn({3})});
  auto x = torch::randn({3}, torch::kDouble), y = torch::randn({3});
  ExpectSame(f({x, y}), AddRelu({x, y}));
  auto events = f.recompiles();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].reasons, ElementsAre("tensor 'arg0' dtype mismatch. expected Float, actual Double"));
}

TEST(Acceptance, RankChangeAndArgNames) {
  auto o = Static();
  o.arg_names = {"x", "bias"};
  auto f = warden::compile(AddRelu, o);
  f({torch::randn({3, 4}), torch::randn({4})});
  f({torch::randn({2, 3, 4}), torch::randn({4})});
  auto events = f.recompiles();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].reasons, ElementsAre("tensor 'x' rank mismatch. expected 2, actual 3"));
}

std::vector<at::Tensor> Scale(const std::vector<c10::IValue>& a) {
  return {a[0].toTensor() * a[1].toDouble() + a[2].toInt()};
}

TEST(Acceptance, ScalarValueChangeRecompiles) {
  auto f = warden::compile(Scale, Static());
  auto x = torch::randn({4});
  ExpectSame(f({x, 0.5, int64_t{3}}), Scale({x, 0.5, int64_t{3}}));
  ExpectSame(f({x, 0.5, int64_t{4}}), Scale({x, 0.5, int64_t{4}}));
  ExpectSame(f({x, 0.25, int64_t{4}}), Scale({x, 0.25, int64_t{4}}));
  auto events = f.recompiles();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_THAT(events[0].reasons, ElementsAre("scalar 'arg2' value mismatch. expected 3, actual 4"));
  EXPECT_EQ(events[1].reasons.at(0), "scalar 'arg1' value mismatch. expected 0.5, actual 0.25");
  EXPECT_EQ(f.stats().compiles, 3);
}

TEST(Acceptance, NanEqualsNanButNegativeZeroDiffers) {
  auto f = warden::compile(Scale, Static());
  auto x = torch::randn({4});
  const double nan = std::nan("");
  f({x, nan, int64_t{1}});
  f({x, nan, int64_t{1}});
  EXPECT_EQ(f.stats().compiles, 1);
  f({x, 0.0, int64_t{1}});
  auto y = f({x, -0.0, int64_t{1}});
  EXPECT_EQ(f.stats().compiles, 3);
  EXPECT_THAT(f.recompiles().back().reasons.at(0), HasSubstr("expected 0, actual -0.0"));
  ExpectSame(y, Scale({x, -0.0, int64_t{1}}));
}

TEST(Acceptance, TypeChangeOfArgument) {
  auto f = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        if (a[1].isTensor()) return {a[0].toTensor() + a[1].toTensor()};
        return {a[0].toTensor() + a[1].toInt()};
      },
      Static());
  auto x = torch::randn({3});
  f({x, torch::randn({3})});
  auto out = f({x, int64_t{2}});
  ExpectSame(out, {x + 2});
  EXPECT_THAT(f.recompiles().at(0).reasons,
              ElementsAre("expected type of 'arg1' to be Tensor, but found Int"));
}

TEST(Acceptance, UnusedArgumentNeverRecompiles) {
  auto f = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> { return {a[0].toTensor().exp()}; },
      Static());
  auto x = torch::randn({3});
  for (int n = 1; n < 6; ++n) f({x, torch::randn({n, n + 1})});
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().cache_hits, 4);
  for (const std::string& g : f.guards(0)) EXPECT_THAT(g, ::testing::Not(HasSubstr("arg1.size")));
}

TEST(Acceptance, CacheLimitRunsEagerlyWithOneWarning) {
  auto o = Static();
  o.cache_size_limit = 2;
  auto f = warden::compile(AddRelu, o);
  auto y = torch::randn({4});
  f({torch::randn({1, 4}), y});
  f({torch::randn({2, 4}), y});
  testing::internal::CaptureStderr();
  auto x3 = torch::randn({3, 4});
  ExpectSame(f({x3, y}), AddRelu({x3, y}));
  auto x4 = torch::randn({4, 4});
  ExpectSame(f({x4, y}), AddRelu({x4, y}));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("warden hit cache_size_limit (2)\n   function: 'fn#"));
  EXPECT_EQ(err.find("warden hit"), err.rfind("warden hit")) << "warned twice: " << err;
  EXPECT_THAT(err, HasSubstr("from now on: calls that match no entry run eagerly"));
  auto s = f.stats();
  EXPECT_EQ(s.compiles, 2);
  EXPECT_EQ(s.eager_calls, 2);
  EXPECT_EQ(f.recompiles().back().action, "cache_size_limit (2) hit: ran eagerly");
  // Cached sizes still hit.
  f({torch::randn({1, 4}), y});
  EXPECT_EQ(f.stats().cache_hits, 1);
}

TEST(Acceptance, FailOnCacheLimitThrows) {
  auto o = Static();
  o.cache_size_limit = 1;
  o.fail_on_cache_limit = true;
  auto f = warden::compile(AddRelu, o);
  f({torch::randn({1, 4}), torch::randn({4})});
  try {
    f({torch::randn({2, 4}), torch::randn({4})});
    FAIL() << "expected warden::Error";
  } catch (const warden::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cache_size_limit (1)"));
    EXPECT_THAT(e.what(), testing::ContainsRegex(
                              "last reason: [0-9]+/0: tensor 'arg0' size mismatch at index 0. expected 1, actual 2"));
  }
}

TEST(Acceptance, MutationOfArgumentMatchesEager) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    x.mul_(2).add_(a[1].toTensor());
    return {x.sum()};
  };
  auto f = warden::compile(fn, Static());
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({4}), y = torch::randn({4});
    auto x_eager = x.clone();
    auto want = fn({x_eager, y});
    auto got = f({x, y});
    ExpectSame(got, want);
    EXPECT_TRUE(torch::allclose(x, x_eager)) << "argument mutation differs at call " << i;
  }
  EXPECT_EQ(f.stats().compiles, 1);
}

TEST(Acceptance, AliasingBetweenArgumentsIsGuardedWhenMutating) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    x.add_(1);
    return {x + a[1].toTensor()};
  };
  auto f = warden::compile(fn, Static());
  auto x = torch::zeros({3}), y = torch::zeros({3});
  f({x, y});
  // Now both arguments are the same tensor: eager sees the mutation through y.
  auto z = torch::zeros({3});
  auto z_eager = torch::zeros({3});
  auto got = f({z, z});
  auto want = fn({z_eager, z_eager});
  ExpectSame(got, want);
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_THAT(f.recompiles().at(0).reasons.at(0), HasSubstr("aliasing mismatch with 'arg1'"));
}

TEST(Acceptance, OutputAliasingInputAliasesAsInEager) {
  auto f = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        at::Tensor x = a[0].toTensor();
        return {x, x.view({-1}), x.t()};
      },
      Static());
  auto x = torch::randn({2, 3});
  f({x});
  auto x2 = torch::randn({2, 3});
  auto out = f({x2});
  EXPECT_EQ(f.stats().cache_hits, 1);
  EXPECT_TRUE(out[0].is_same(x2));
  EXPECT_TRUE(out[1].is_alias_of(x2));
  EXPECT_TRUE(out[2].is_alias_of(x2));
  EXPECT_EQ(out[2].strides(), x2.t().strides());
}

TEST(Acceptance, EagerErrorsSurfaceUnchanged) {
  auto f = warden::compile(AddRelu, Static());
  EXPECT_THROW(f({torch::randn({3}), torch::randn({4})}), c10::Error);
  EXPECT_EQ(f.stats().compiles, 0);
  auto x = torch::randn({3});
  ExpectSame(f({x, x}), AddRelu({x, x}));
}

TEST(Acceptance, UnsupportedArgumentTypeIsAClearError) {
  auto f = warden::compile(AddRelu, Static());
  try {
    f({torch::randn({3}), c10::IValue(std::string("hello"))});
    FAIL();
  } catch (const warden::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("argument 'arg1' has unsupported type String"));
  }
}

TEST(Acceptance, RandomOpsDrawAgainEachCall) {
  auto f = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        return {a[0].toTensor() + torch::randn({4})};
      },
      Static());
  auto x = torch::zeros({4});
  auto a = f({x})[0], b = f({x})[0];
  EXPECT_EQ(f.stats().cache_hits, 1);
  EXPECT_FALSE(torch::equal(a, b));
  torch::manual_seed(7);
  auto c = f({x})[0];
  torch::manual_seed(7);
  auto want = x + torch::randn({4});
  EXPECT_TRUE(torch::equal(c, want)) << "replay must consume the generator as eager does";
}

TEST(Acceptance, ItemBranchIsValueGuarded) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    if (x.sum().item<double>() > 0) return {x * 2};
    return {x - 1};
  };
  auto f = warden::compile(fn, Static());
  auto pos = torch::ones({3}), neg = -torch::ones({3});
  ExpectSame(f({pos}), fn({pos}));
  ExpectSame(f({neg}), fn({neg}));  // value guard fails inside the artifact: retrace
  ExpectSame(f({pos}), fn({pos}));
  ExpectSame(f({neg}), fn({neg}));
  ExpectSame(f({pos * 3}), fn({pos * 3}));  // different sum: value guard differs again
  auto events = f.recompiles();
  ASSERT_GE(events.size(), 1u);
  EXPECT_THAT(events[0].reasons.at(0), HasSubstr("value of aten::_local_scalar_dense at %"));
  EXPECT_THAT(events[0].reasons.at(0), HasSubstr("changed: expected 3., actual -3."));
}

TEST(Acceptance, DataDependentReadAfterMutationRunsEagerly) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    x.add_(1);
    if (x.sum().item<double>() > 0) return {x * 2};
    return {x - 1};
  };
  auto f = warden::compile(fn, Static());
  testing::internal::CaptureStderr();
  for (double v : {1.0, -5.0, 2.0}) {
    auto x = torch::full({3}, v), x_eager = torch::full({3}, v);
    ExpectSame(f({x}), fn({x_eager}));
    EXPECT_TRUE(torch::equal(x, x_eager));
  }
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(f.stats().compiles, 0);
  EXPECT_EQ(f.stats().eager_calls, 3);
  EXPECT_THAT(f.explain(), HasSubstr("runs eagerly: data-dependent"));
}

TEST(Acceptance, RawDataAccessRunsEagerlyAndSaysWhy) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    const float first = a[0].toTensor().data_ptr<float>()[0];
    return {a[0].toTensor() * first};
  };
  auto f = warden::compile(fn, Static());
  testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({3});
    ExpectSame(f({x}), fn({x}));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("reads raw data of a traced tensor"));
  EXPECT_EQ(f.stats().eager_calls, 3);
  EXPECT_EQ(f.stats().compiles, 0);
  ASSERT_EQ(f.recompiles().size(), 1u);
  EXPECT_THAT(f.recompiles()[0].action, HasSubstr("runs eagerly from now on"));
}

TEST(Acceptance, RequiresGradIsVisibleAndBackwardWorksThroughReplay) {
  auto f = warden::compile(
      [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
        at::Tensor x = a[0].toTensor();
        return {x.requires_grad() ? x * 3 : x * 2};
      },
      Static());
  auto x = torch::randn({3}, torch::requires_grad());
  ExpectSame(f({x}), {x * 3});
  auto out = f({x});  // replayed
  EXPECT_EQ(f.stats().cache_hits, 1);
  ASSERT_TRUE(out[0].requires_grad());
  out[0].sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), torch::full({3}, 3.0f)));
  // Without requires_grad the branch differs: a guard must catch it.
  auto plain = torch::randn({3});
  ExpectSame(f({plain}), {plain * 2});
  EXPECT_THAT(f.recompiles().at(0).reasons.at(0),
              HasSubstr("tensor 'arg0' requires_grad mismatch. expected true, actual false"));
}

// Note [Metadata at entry] (guards/builder.cc): an argument that the function makes require grad
// in place (add_ with an operand that requires grad) is guarded on requires_grad as it arrived,
// false; guarding the state after the call made every call recompile (found by the fuzzer,
// seed 136732), and an input that really requires grad must still miss.
TEST(Acceptance, GuardsDescribeArgumentsAsTheyArrived) {
  warden::Fn fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor();
    x.add_(a[1].toTensor());
    return {x * 2};
  };
  auto f = warden::compile(fn, Static());
  const at::Tensor w = torch::randn({3}, torch::requires_grad());
  for (int i = 0; i < 3; ++i) {
    at::Tensor x = torch::randn({3}), xe = x.clone();
    const auto got = f({x, w});
    const auto want = fn({xe, w});
    ExpectSame(got, want);
    EXPECT_TRUE(x.requires_grad());
  }
  EXPECT_EQ(f.stats().compiles, 1) << f.explain();
  EXPECT_EQ(f.stats().cache_hits, 2);
  EXPECT_THAT(f.guards(0), ::testing::Contains("arg0.requires_grad == false  # tensor metadata is not observable to "
                                               "the tracer: always guarded"));
  // An argument that requires grad on arrival is another entry (here eager raises: a leaf that
  // requires grad cannot be written in place).
  const at::Tensor leaf = torch::randn({3}, torch::requires_grad());
  EXPECT_THROW(f({leaf, w}), c10::Error);
  EXPECT_EQ(f.stats().cache_hits, 2);
}

TEST(Acceptance, TensorLiteralInsideFunction) {
  auto fn = [](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {a[0].toTensor() + torch::tensor({1.f, 2.f, 3.f})};
  };
  auto f = warden::compile(fn, Static());
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({2, 3});
    ExpectSame(f({x}), fn({x}));
  }
  EXPECT_EQ(f.stats().compiles, 1);
}

TEST(Acceptance, GradModeIsGuarded) {
  auto f = warden::compile(AddRelu, Static());
  auto x = torch::randn({3}), y = torch::randn({3});
  {
    torch::NoGradGuard no_grad;
    f({x, y});
  }
  f({x, y});
  EXPECT_EQ(f.stats().compiles, 2);
  EXPECT_THAT(f.recompiles().at(0).reasons.at(0), HasSubstr("grad mode mismatch. expected disabled, actual enabled"));
}

TEST(Acceptance, InferenceModeHitPath) {
  c10::InferenceMode guard;
  auto w = torch::randn({8, 16}), b = torch::randn({8});
  auto fn = [&](const std::vector<c10::IValue>& a) -> std::vector<at::Tensor> {
    return {torch::gelu(torch::linear(a[0].toTensor(), w, b)).softmax(-1)};
  };
  auto f = warden::compile(fn, Static());
  for (int i = 0; i < 4; ++i) {
    auto x = torch::randn({4, 16});
    ExpectSame(f({x}), fn({x}));
  }
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().cache_hits, 3);
}

TEST(Acceptance, LogsRecompilesInDocumentedFormat) {
  setenv("WARDEN_LOGS", "recompiles", 1);
  auto f = warden::compile(AddRelu, Static("logged"));
  unsetenv("WARDEN_LOGS");
  f({torch::randn({3, 4}), torch::randn({4})});
  testing::internal::CaptureStderr();
  f({torch::randn({4, 4}), torch::randn({4})});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, testing::MatchesRegex(
                       "Recompiling function logged\n    triggered by the following guard failure\\(s\\):\n"
                       "    - [0-9]+/0: tensor 'arg0' size mismatch at index 0. expected 3, actual 4\n"));
}

TEST(Acceptance, ExplainShowsGraphGuardsAndEvents) {
  auto f = warden::compile(AddRelu, Static("explained"));
  f({torch::randn({3, 4}), torch::randn({4})});
  f({torch::randn({2, 4}), torch::randn({4})});
  const std::string text = f.explain();
  EXPECT_THAT(text, HasSubstr("function 'explained'"));
  EXPECT_THAT(text, HasSubstr("aten::add.Tensor(%arg0, %arg1, 1)"));
  EXPECT_THAT(text, HasSubstr("arg0.size(0) == 3  # used by aten::add.Tensor at %0"));
  EXPECT_THAT(text, HasSubstr("call 1: recompiled"));
  const std::string json = f.explain_json();
  EXPECT_THAT(json, HasSubstr("\"entries\""));
  EXPECT_THAT(json, HasSubstr("\"action\": \"recompiled\""));
  EXPECT_THAT(json, HasSubstr("\"provenance\": \"used by aten::add.Tensor at %0 (static shapes)\""));
  f.reset();
  EXPECT_TRUE(f.recompiles().empty());
  EXPECT_THROW(f.guards(0), warden::Error);
}

// Kernel libraries of these tests go to the test's own directory, not to a shared cache.
void UseTestCacheDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/warden-acceptance";
  setenv("WARDEN_CACHE_DIR", dir.c_str(), 1);
}

TEST(Acceptance, DefaultBackendIsCppAndCompilesKernels) {
  UseTestCacheDir();
  EXPECT_EQ(warden::Options{}.backend, "cpp");
  auto f = warden::compile(AddRelu);
  auto x = torch::randn({3}), y = torch::randn({3});
  ExpectSame(f({x, y}), AddRelu({x, y}));
  ExpectSame(f({y, x}), AddRelu({y, x}));
  EXPECT_EQ(f.stats().cache_hits, 1);
  const std::string text = f.explain();
  EXPECT_THAT(text, HasSubstr(": backend cpp, created at call 0"));
  EXPECT_THAT(text, HasSubstr("kernels: 1 fused region in "));
  EXPECT_THAT(f.explain_json(), HasSubstr("extern \\\"C\\\""));  // JSON-escaped source
}

TEST(Acceptance, OutputCodeLogPrintsTheGeneratedSource) {
  UseTestCacheDir();
  setenv("WARDEN_LOGS", "output_code", 1);
  warden::Options o;
  o.name = "logged";
  auto f = warden::compile(AddRelu, o);
  unsetenv("WARDEN_LOGS");
  auto x = torch::randn({5}), y = torch::randn({5});
  testing::internal::CaptureStderr();
  ExpectSame(f({x, y}), AddRelu({x, y}));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("warden: output code of logged entry "));
  EXPECT_THAT(err, HasSubstr("extern \"C\""));
  EXPECT_THAT(err, HasSubstr(".so"));
}

// Note [Background compile]: the first call returns at once, later calls replay until the kernel
// is installed, and every result along the way equals eager.
TEST(Acceptance, AsyncCompileSwitchesToTheKernelWithoutWrongResults) {
  UseTestCacheDir();
  // A compiler that takes a second, so that the replay phase is certain to be observed.
  const std::string slow = std::string(std::getenv("WARDEN_CACHE_DIR")) + "-slow-cxx.sh";
  {
    std::ofstream script(slow);
    script << "#!/bin/sh\nsleep 1\nexec g++ \"$@\"\n";
  }
  ASSERT_EQ(chmod(slow.c_str(), 0755), 0);
  setenv("WARDEN_CXX", slow.c_str(), 1);
  warden::Options o;
  o.async_compile = true;
  o.name = "async";
  auto f = warden::compile(AddRelu, o);
  auto y = torch::randn({64});
  auto x0 = torch::randn({64});
  ExpectSame(f({x0, y}), AddRelu({x0, y}));
  EXPECT_THAT(f.explain(), HasSubstr("compiling with 'cpp' in the background; replaying with 'aten'"));
  ExpectSame(f({y, x0}), AddRelu({y, x0}));  // served by the replay artifact
  EXPECT_EQ(f.stats().cache_hits, 1);
  bool switched = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    auto x = torch::randn({64});
    ExpectSame(f({x, y}), AddRelu({x, y}));
    if (f.explain().find(": backend cpp, created") != std::string::npos) {
      switched = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(switched) << f.explain();
  for (int i = 0; i < 10; ++i) {
    auto x = torch::randn({64});
    ExpectSame(f({x, y}), AddRelu({x, y}));
  }
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().eager_calls, 0);
  EXPECT_THAT(f.explain(), HasSubstr("kernels: 1 fused region in "));
  unsetenv("WARDEN_CXX");
}

TEST(Acceptance, ConcurrentCallersAgreeWithEager) {
  auto f = warden::compile(AddRelu, Static());
  auto y = torch::randn({4});
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto x = torch::randn({1 + (i + t) % 3, 4});
        auto got = f({x, y})[0];
        if (!torch::allclose(got, AddRelu({x, y})[0])) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  auto s = f.stats();
  EXPECT_EQ(s.calls, 200);
  EXPECT_EQ(s.compiles, 3) << "one compile per signature, never duplicated";
  EXPECT_EQ(s.cache_hits + s.compiles + s.eager_calls, s.calls);
}

}  // namespace
