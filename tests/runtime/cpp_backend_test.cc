// Tests of backend "cpp" (runtime/cpp_backend.cc, codegen_*.cc) through warden::compile:
// differential tests against eager for every fused op and for chains (f32/f64/i64/b8 and ATen's
// type promotion, NaN/Inf, empty, broadcast, strided and non-contiguous operands, 0-dim operands,
// static and symbolic sizes, reductions over any dim(s) with fused prologues and epilogues,
// inlined small constants and their run-time check, mixed graphs), each asserting
// that the kernels really ran (no region fell back to replay); the on-disk kernel cache (reuse in
// the same and in a second process, corrupt files) and the fallback to "aten" without a compiler.
// Every test uses its own WARDEN_CACHE_DIR.
#include <unistd.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "runtime/codegen_artifact.h"
#include "runtime/codegen_compiler.h"
#include "runtime/codegen_pointwise.h"
#include "runtime/warden.h"
#include "tests/test_env.h"
#include "tracer/tracer.h"

extern char** environ;

namespace warden {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using Args = std::vector<c10::IValue>;
using json = nlohmann::json;

constexpr char kBackend[] = "cpp";

Options Cpp(const std::string& name = "fn") {
  Options o;
  o.name = name;
  o.backend = kBackend;
  o.dynamic = Dynamic::kStatic;
  return o;
}

using test_util::ReadFile;
using test_util::ScopedCacheDir;
using test_util::ScopedEnv;

// got == want as eager computes it: same shape and dtype, NaN at exactly the same positions,
// infinities equal (with sign), finite values allclose.
void ExpectMatches(const at::Tensor& got, const at::Tensor& want, double rtol, double atol,
                   const std::string& what = "") {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  if (!want.is_floating_point()) {  // integers and bools: exactly
    EXPECT_TRUE(torch::equal(got, want)) << what << "\ngot\n" << got << "\nwant\n" << want;
    return;
  }
  EXPECT_TRUE(torch::equal(torch::isnan(got), torch::isnan(want))) << what << "\ngot\n"
                                                                      << got << "\nwant\n" << want;
  EXPECT_TRUE(torch::equal(torch::isposinf(got), torch::isposinf(want))) << what << "\ngot\n"
                                                                         << got << "\nwant\n" << want;
  EXPECT_TRUE(torch::equal(torch::isneginf(got), torch::isneginf(want))) << what << "\ngot\n"
                                                                         << got << "\nwant\n" << want;
  EXPECT_TRUE(torch::allclose(got, want, rtol, atol, /*equal_nan=*/true))
      << what << "\nmax diff " << (got - want).abs().nan_to_num(0, 0, 0).max().item<double>();
}

double Rtol(at::ScalarType t) { return t == at::kFloat ? 1e-5 : 1e-12; }
double Atol(at::ScalarType t) { return t == at::kFloat ? 1e-6 : 1e-12; }

void ExpectAllMatch(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ExpectMatches(got[i], want[i], Rtol(want[i].scalar_type()), Atol(want[i].scalar_type()),
                  absl::StrCat("output ", i));
  }
}

// The 10-op chain: mul, add, tanh, sub, relu, sigmoid, exp, mul.Scalar, add (alpha 2), neg.
at::Tensor Chain10(const at::Tensor& x, const at::Tensor& w) {
  at::Tensor y = x * w;
  y = y + x;
  y = torch::tanh(y);
  y = y - w;
  y = torch::relu(y);
  y = torch::sigmoid(y);
  y = torch::exp(y);
  y = y * 0.5;
  y = torch::add(y, x, 2);
  return -y;
}

std::vector<at::Tensor> Chain10Fn(const Args& a) { return {Chain10(a[0].toTensor(), a[1].toTensor())}; }

// Calls f twice (the first call returns the trace's eager result) and returns the cached run.
std::vector<at::Tensor> CallCached(CompiledFunction& f, const Args& args) {
  f(args);
  return f(args);
}

std::string EntryBackend(const CompiledFunction& f, int entry = 0) {
  return json::parse(f.explain_json())["entries"][entry]["backend"].get<std::string>();
}

// The kernel sources in the cache (one .cc per compiled library).
std::string AllSources(const ScopedCacheDir& dir) {
  std::string all;
  for (const std::string& p : dir.Files(".cc")) all += ReadFile(p);
  return all;
}

// The number of fused regions of entry `entry` and its generated source, from explain_json().
int FusedRegions(const CompiledFunction& f, int entry = 0) {
  return json::parse(f.explain_json())["entries"][entry]["fused_regions"].get<int>();
}
std::string EntrySource(const CompiledFunction& f, int entry = 0) {
  return json::parse(f.explain_json())["entries"][entry]["generated_source"].get<std::string>();
}

// Fails the test if a fused region fell back to replay in its scope: the kernels really ran.
class ExpectKernelsRan {
 public:
  ExpectKernelsRan() : before_(CodegenRegionFallbacks()) {}
  ~ExpectKernelsRan() { EXPECT_EQ(CodegenRegionFallbacks(), before_) << "a fused region was replayed"; }

 private:
  int64_t before_;
};

class CppBackendTest : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(CppBackendTest, Chain10SmallAndLarge) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  for (int64_t n : {16, 1 << 20}) {
    const auto opts = torch::TensorOptions().dtype(GetParam());
    const at::Tensor x = torch::randn({n}, opts), w = torch::randn({n}, opts);
    CompiledFunction f = compile(Chain10Fn, Cpp());
    const auto got = CallCached(f, {x, w});
    ExpectAllMatch(got, {Chain10(x, w)});
    EXPECT_EQ(f.stats().cache_hits, 1);
    EXPECT_EQ(EntryBackend(f), kBackend);
  }
  // Static shapes: the sizes are literals, so each size has its own library.
  EXPECT_EQ(dir.Files(".so").size(), 2u);
  const std::string source = AllSources(dir);
  EXPECT_THAT(source, HasSubstr("extern \"C\" void warden_kernel_0(const void** in, void** out, "
                                "const int64_t* params, int64_t begin, int64_t end)"));
  EXPECT_THAT(source, HasSubstr("#pragma omp simd"));
  EXPECT_THAT(source, HasSubstr("const int64_t s0 = 16;"));
  EXPECT_THAT(source, HasSubstr("const int64_t s0 = 1048576;"));
  for (const char* op : {"aten::mul.Tensor", "aten::add.Tensor", "aten::tanh", "aten::sub.Tensor",
                         "aten::relu", "aten::sigmoid", "aten::exp", "aten::mul.Scalar", "aten::neg"}) {
    EXPECT_THAT(source, HasSubstr(op));
  }
}

TEST_P(CppBackendTest, NanAndInfPropagateLikeEager) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  const auto opts = torch::TensorOptions().dtype(GetParam());
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const at::Tensor x = torch::tensor({nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e30, -1e30,
                                      1e-40, 88.8, -88.8, 3.0, -3.0, 1e38, -710.0},
                                     opts);
  const at::Tensor w = torch::tensor({1.0, nan, 2.0, inf, -inf, 0.0, -0.0, -1.0, nan, 1e30, 1e30,
                                      -1e-40, 1.0, 1.0, -inf, inf, 2.0, 1.0},
                                     opts);
  CompiledFunction f = compile(Chain10Fn, Cpp());
  ExpectAllMatch(CallCached(f, {x, w}), {Chain10(x, w)});
  EXPECT_EQ(EntryBackend(f), kBackend);
}

// Every fused op in one region (one compile), on special values.
std::vector<at::Tensor> AllOps(const Args& a) {
  const at::Tensor& x = a[0].toTensor();
  const at::Tensor& y = a[1].toTensor();
  return {x + y,
          torch::add(x, y, 2.5),
          x + 1.5,
          torch::add(x, 3, -2),
          x - y,
          torch::sub(x, y, 0.5),
          x - 2,
          torch::rsub(x, y),
          torch::rsub(x, y, 3),
          torch::rsub(x, 1.0),
          x * y,
          x * 3,
          x / y,
          x / 3.0,
          -x,
          torch::relu(x),
          torch::sigmoid(x),
          torch::tanh(x),
          torch::exp(x),
          torch::log(x),
          torch::abs(x),
          torch::sqrt(x),
          torch::rsqrt(x),
          torch::reciprocal(x),
          torch::square(x),
          x.clamp_min(0.5),
          x.clamp_max(-0.5),
          torch::maximum(x, y),
          torch::minimum(x, y)};
}

TEST_P(CppBackendTest, EveryFusedOpMatchesEagerOnSpecialValues) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  const auto opts = torch::TensorOptions().dtype(GetParam());
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  std::vector<double> xs = {nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e30, -1e30, 1e-40, 88.8,
                            -88.8, 3.0, -3.0, 20.0, -20.0, 1e-3, 7.25};
  std::vector<double> ys = {1.0, nan, 2.0, inf, -inf, 0.0, -0.0, -1.0, nan, 1e30, 3.0, -1e-40, 1.0,
                            1.0, -inf, inf, -20.0, 20.0, 0.25, -7.25};
  // Plus ordinary values, so that the vectorized body (not just the scalar tail) runs.
  for (int i = 0; i < 100; ++i) {
    xs.push_back(std::sin(i) * 5);
    ys.push_back(std::cos(i * 0.7) * 3);
  }
  const at::Tensor x = torch::tensor(xs, opts), y = torch::tensor(ys, opts);
  CompiledFunction f = compile(AllOps, Cpp());
  const auto got = CallCached(f, {x, y});
  const auto want = AllOps({x, y});
  ExpectAllMatch(got, want);
  EXPECT_EQ(EntryBackend(f), kBackend);
  EXPECT_GE(FusedRegions(f), 1);
}

// Every op of FusibleOps() is exercised by a differential test (AllOps, FloatOps, PromotionOps).
std::vector<at::Tensor> FloatOps(const Args& a);
std::vector<at::Tensor> PromotionOps(const Args& a);
Args PromotionArgs();
TEST(CppBackend, EveryFusibleOpIsTested) {
  ScopedCacheDir dir;
  const at::Tensor x = torch::randn({40}), y = torch::randn({40});
  for (const auto& [fn, args] : std::vector<std::pair<Fn, Args>>{
           {AllOps, {x, y}}, {FloatOps, {x}}, {PromotionOps, PromotionArgs()}}) {
    CompiledFunction f = compile(fn, Cpp());
    CallCached(f, args);
  }
  const std::string source = AllSources(dir);
  for (const std::string& op : codegen::FusibleOps()) EXPECT_THAT(source, HasSubstr(op)) << op;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CppBackendTest, ::testing::Values(at::kFloat, at::kDouble),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(CppBackend, EmptyTensors) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{0}, {3, 0}}) {
    const at::Tensor x = torch::randn(shape), w = torch::randn(shape);
    CompiledFunction f = compile(Chain10Fn, Cpp());
    ExpectAllMatch(CallCached(f, {x, w}), {Chain10(x, w)});
  }
}

TEST(CppBackend, NonContiguousInputsAreCorrect) {
  ScopedCacheDir dir;
  const at::Tensor x = torch::randn({64, 64}), w = torch::randn({64, 64});
  // Traced on contiguous inputs, called with a transposed one: either a guard recompiles or the
  // kernel's run-time layout check replays the region; both must match eager.
  CompiledFunction f = compile(Chain10Fn, Cpp("contiguous_first"));
  ExpectAllMatch(CallCached(f, {x, w}), {Chain10(x, w)});
  const at::Tensor xt = x.t();
  ASSERT_FALSE(xt.is_contiguous());
  const int64_t fallbacks = CodegenRegionFallbacks();
  ExpectAllMatch(f({xt, w}), {Chain10(xt, w)});
  ExpectAllMatch(f({xt, w}), {Chain10(xt, w)});
  std::cout << "transposed input: "
            << (f.stats().compiles == 1 ? "no recompile, the kernel's check replayed the region"
                                        : "a guard recompiled")
            << "\n";
  if (f.stats().compiles == 1) {
    EXPECT_EQ(CodegenRegionFallbacks(), fallbacks + 2);  // no stride guard: the kernel's check
  }
  ExpectAllMatch(f({x, w}), {Chain10(x, w)});
  // Traced on a transposed input: the ops that touch it are not fused (their results are not
  // contiguous either), the rest may be.
  CompiledFunction g = compile(Chain10Fn, Cpp("transposed_first"));
  ExpectAllMatch(CallCached(g, {xt, w}), {Chain10(xt, w)});
  ExpectAllMatch(g({xt, w.t()}), {Chain10(xt, w.t())});
  // A sliced (offset, strided) input.
  const at::Tensor big = torch::randn({64, 128});
  const at::Tensor sliced = big.slice(1, 1, 65);
  ExpectAllMatch(f({sliced, w}), {Chain10(sliced, w)});
}

// Symbolic sizes are a run-time parameter of the kernel: after automatic dynamic shapes made the
// size symbolic, one source (and library) serves every size, and each size is correct.
TEST(CppBackend, DynamicSizesShareOneKernel) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  Options o = Cpp();
  o.dynamic = Dynamic::kAuto;
  CompiledFunction f = compile(Chain10Fn, o);
  for (int64_t n : {16, 17, 100, 5000, 16}) {
    const at::Tensor x = torch::randn({n}), w = torch::randn({n});
    f({x, w});
    ExpectAllMatch(f({x, w}), {Chain10(x, w)});
  }
  EXPECT_LE(f.stats().compiles, 2);
  EXPECT_EQ(dir.Files(".so").size(), 2u);  // the static first entry (size 16) and the symbolic one
  EXPECT_THAT(AllSources(dir), HasSubstr("params[0]"));
}

// A double argument used as a Scalar is a literal in the kernel; its guard recompiles on change.
TEST(CppBackend, ScalarArgumentsAreGuarded) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    return {torch::tanh(a[0].toTensor() * a[1].toDouble()) + a[2].toInt()};
  };
  const at::Tensor x = torch::randn({64});
  CompiledFunction f = compile(fn, Cpp());
  for (const Args& args : {Args{x, 2.0, int64_t{1}}, Args{x, -0.5, int64_t{1}}, Args{x, -0.5, int64_t{7}}}) {
    f(args);
    ExpectAllMatch(f(args), fn(args));
  }
}

// With 2 intra-op threads, kernels over more than one grain (32768 elements) are split by
// at::parallel_for (runtime/cpp_backend.cc is built with -fopenmp, else it would not split): every
// split of pointwise elements, reduction rows and columns must give eager's result. Sizes are
// odd so that chunk boundaries fall inside rows and vectors.
TEST(CppBackend, KernelsSplitAcrossIntraOpThreadsMatchEager) {
#ifdef __SANITIZE_THREAD__
  // Debian's libgomp is not instrumented: TSan does not see its barriers and reports every
  // OpenMP region, eager's own included, as a race.
  GTEST_SKIP() << "OpenMP regions under TSan";
#endif
  ScopedCacheDir dir;
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();  // [R, C]
    const at::Tensor& w = a[1].toTensor();  // [C]
    const at::Tensor& t = a[2].toTensor();  // [R, C], transposed storage
    return {torch::softmax(x * 0.5, -1) * 2, torch::softmax(t, 0), x.sum(0) + 1,
            torch::amax(t + x, -1, true), torch::layer_norm(x + t, {x.size(1)})};
  };
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{257, 301}, {1031, 67}}) {
    const Args args = {torch::randn({rows, cols}), torch::randn({cols}), torch::randn({cols, rows}).t()};
    for (const Fn& g : {Fn(fn), Fn(Chain10Fn)}) {  // reduction kernels, and a pointwise-only one
      CompiledFunction f = compile(g, Cpp("split"));
      ExpectKernelsRan kernels_ran;
      const auto got = CallCached(f, args), want = g(args);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ExpectMatches(got[i], want[i], Rtol(at::kFloat), 1e-4, absl::StrCat("output ", i, " of ", rows, "x", cols));
      }
    }
  }
  at::set_num_threads(threads);
}

// An artifact runs from many threads at once (each large call also splits across ATen's pool).
TEST(CppBackend, RunsFromManyThreads) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  const at::Tensor x = torch::randn({100000}), w = torch::randn({100000});
  const at::Tensor want = Chain10(x, w);
  CompiledFunction f = compile(Chain10Fn, Cpp());
  f({x, w});
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) wrong += !torch::allclose(f({x, w})[0], want, 1e-5, 1e-6);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(f.stats().cache_hits, 80);
}

// 0-dim tensors (an argument and a captured constant) are read once and broadcast.
TEST(CppBackend, ZeroDimOperands) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  const at::Tensor bias = torch::tensor(0.25f);
  auto fn = [bias](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    const at::Tensor& s = a[1].toTensor();
    return {torch::tanh(x * s + bias) - s};
  };
  const at::Tensor x = torch::randn({1000}), s = torch::tensor(1.5f);
  CompiledFunction f = compile(fn, Cpp());
  ExpectAllMatch(CallCached(f, {x, s}), fn({x, s}));
  const at::Tensor s2 = torch::tensor(-3.0f);
  ExpectAllMatch(f({x, s2}), fn({x, s2}));  // the value is read at run time, not baked in
  // Stride 0: the same element on every iteration, indexed by the row offset alone.
  EXPECT_THAT(AllSources(dir), ::testing::ContainsRegex("= in[0-9]+\\[o[0-9]+\\];"));
}

TEST(CppBackend, MixedGraphMatmulChainSoftmax) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    const at::Tensor& w = a[1].toTensor();
    const at::Tensor& b = a[2].toTensor();
    at::Tensor h = torch::matmul(x, w);
    at::Tensor y = torch::sigmoid(torch::tanh(h * 2 + b) - h);
    at::Tensor s = torch::softmax(y, -1);
    return {s, torch::matmul(s, w.t()) * 3 - 1};
  };
  // Matmuls of more multiply-adds than a straight-line program takes (kMaxProgramMacs): ATen calls
  // between the regions (small ones are tests/runtime/program_test.cc's).
  const at::Tensor x = torch::randn({64, 128}), w = torch::randn({128, 64}), b = torch::randn({64, 64});
  CompiledFunction f = compile(fn, Cpp());
  ExpectAllMatch(CallCached(f, {x, w, b}), fn({x, w, b}));
  EXPECT_EQ(EntryBackend(f), kBackend);
  const std::string source = AllSources(dir);
  // Two regions: the chain ending in the softmax (Note [Row reductions]), and the one after the
  // second matmul.
  EXPECT_THAT(source, HasSubstr("warden_kernel_1"));
  EXPECT_THAT(source, Not(HasSubstr("warden_kernel_2")));
  EXPECT_THAT(source, HasSubstr("aten::softmax.int"));
  EXPECT_THAT(source, Not(HasSubstr("matmul")));
}

// Note [Lone softmax]: a softmax with nothing fused around it is an ATen call above 64 elements
// (ATen's kernel is faster than the generated one), a kernel at or below; fused with its
// neighbours it stays a kernel at any size. Note [Short rows]: row kernels over rows that are not
// a multiple of 16 lanes are marked 8-wide, others are not.
TEST(CppBackend, LoneSoftmaxStaysATenAboveTheLimitShortRowsRunEightWide) {
  ScopedCacheDir dir;
  auto lone = [](const Args& a) -> std::vector<at::Tensor> { return {torch::log_softmax(a[0].toTensor(), -1)}; };
  auto fused = [](const Args& a) -> std::vector<at::Tensor> {
    return {torch::log_softmax(a[0].toTensor() * 0.5, -1)};
  };
  {
    const at::Tensor x = torch::randn({56, 40});  // 2240 elements
    CompiledFunction f = compile(lone, Cpp("lone_large"));
    ExpectAllMatch(CallCached(f, {x}), lone({x}));
    EXPECT_EQ(FusedRegions(f), 0);
    CompiledFunction g = compile(fused, Cpp("fused_large"));
    ExpectAllMatch(CallCached(g, {x}), fused({x}));
    EXPECT_EQ(FusedRegions(g), 1);
    EXPECT_THAT(EntrySource(g), HasSubstr("extern \"C\" WARDEN_SHORT_ROWS void warden_kernel_0("));
  }
  {
    const at::Tensor x = torch::randn({1, 40});
    CompiledFunction f = compile(lone, Cpp("lone_small"));
    ExpectAllMatch(CallCached(f, {x}), lone({x}));
    EXPECT_EQ(FusedRegions(f), 1);
  }
  {
    const at::Tensor x = torch::randn({4, 64});  // rows of a multiple of 16: 16-wide
    CompiledFunction g = compile(fused, Cpp("fused_64"));
    ExpectAllMatch(CallCached(g, {x}), fused({x}));
    EXPECT_EQ(FusedRegions(g), 1);
    EXPECT_THAT(EntrySource(g), HasSubstr("extern \"C\" void warden_kernel_0("));
  }
}

TEST(CppBackend, IntermediateAlsoReturned) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    at::Tensor mid = torch::exp(x * 0.5);
    at::Tensor out = torch::relu(mid - 1.5);
    return {out, mid, out};
  };
  const at::Tensor x = torch::randn({4, 8});
  CompiledFunction f = compile(fn, Cpp());
  const auto got = CallCached(f, {x});
  ExpectAllMatch(got, fn({x}));
  EXPECT_TRUE(got[0].is_same(got[2]));  // the same tensor twice, as eager returns it
  // One kernel with two outputs (mid and out); x * 0.5 and mid - 1.5 stay in registers.
  const std::string source = AllSources(dir);
  EXPECT_THAT(source, HasSubstr("out1[lin + j]"));
  EXPECT_THAT(source, Not(HasSubstr("out2[lin + j]")));
}

// In-place ops are not fused; values around them still are, and the order of effects is eager's.
TEST(CppBackend, InPlaceOpsKeepEagerOrder) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    at::Tensor x = a[0].toTensor().clone();
    at::Tensor y = torch::tanh(x * 2);
    x.add_(1);
    at::Tensor z = torch::sigmoid(x + y);
    y.mul_(z);
    return {y * 3, z, x};
  };
  const at::Tensor x = torch::randn({33});
  CompiledFunction f = compile(fn, Cpp());
  ExpectAllMatch(CallCached(f, {x}), fn({x}));
}

// Compiles `fn` on "cpp", checks the cached run against eager, that at least `min_regions`
// regions were fused and that no region fell back to replay. Returns the generated source.
std::string ExpectFusedMatchesEager(const Fn& fn, const Args& args, int min_regions,
                                    Dynamic dynamic = Dynamic::kStatic) {
  ExpectKernelsRan kernels_ran;
  Options o = Cpp();
  o.dynamic = dynamic;
  CompiledFunction f = compile(fn, o);
  ExpectAllMatch(CallCached(f, args), fn(args));
  EXPECT_EQ(EntryBackend(f), kBackend);
  EXPECT_GE(FusedRegions(f), min_regions) << "fusion silently stopped";
  return EntrySource(f);
}

// Broadcasting between region operands: rows, columns, middle dims, 0-dim tensors, expanded
// (stride 0) and sliced inputs; the strides are literals of the kernel.
TEST(CppBackend, BroadcastOperandsAreFused) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();    // [5, 7]
    const at::Tensor& row = a[1].toTensor();  // [7]
    const at::Tensor& col = a[2].toTensor();  // [5, 1]
    const at::Tensor& s = a[3].toTensor();    // 0-dim
    return {torch::tanh(x + row) * col - s, torch::sigmoid(row * col)};
  };
  const Args args = {torch::randn({5, 7}), torch::randn({7}), torch::randn({5, 1}), torch::tensor(0.5f)};
  const std::string source = ExpectFusedMatchesEager(fn, args, 1);
  EXPECT_THAT(source, HasSubstr("const int64_t s0 = 5;"));
  EXPECT_THAT(source, HasSubstr("const int64_t s1 = 7;"));
  // A 3-d broadcast [4, 1, 6] * [3, 1] -> [4, 3, 6], an expanded input and a sliced one.
  auto fn3 = [](const Args& a) -> std::vector<at::Tensor> {
    return {torch::exp(a[0].toTensor() * a[1].toTensor()) + a[2].toTensor() - a[3].toTensor()};
  };
  const at::Tensor big = torch::randn({4, 3, 13});
  const Args args3 = {torch::randn({4, 1, 6}), torch::randn({3, 1}), torch::randn({6}).expand({4, 3, 6}),
                      big.slice(2, 2, 8)};
  ASSERT_FALSE(args3[3].toTensor().is_contiguous());
  ExpectFusedMatchesEager(fn3, args3, 1);
  // Empty broadcasts.
  ExpectFusedMatchesEager(fn, {torch::randn({0, 7}), torch::randn({7}), torch::randn({0, 1}), torch::tensor(1.f)}, 1);
}

// Symbolic sizes with a broadcast: sizes and outer strides are kernel parameters.
TEST(CppBackend, SymbolicBroadcastSharesOneKernel) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    return {torch::relu(a[0].toTensor() * a[1].toTensor() + 1) > 0.5};
  };
  Options o = Cpp();
  o.dynamic = Dynamic::kDynamic;
  CompiledFunction f = compile(fn, o);
  const at::Tensor row = torch::randn({9});
  for (int64_t n : {3, 8, 70, 3}) {
    const Args args = {torch::randn({n, 9}), row};
    f(args);
    ExpectAllMatch(f(args), fn(args));
  }
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(FusedRegions(f), 1);
  EXPECT_EQ(dir.Files(".so").size(), 1u);
  EXPECT_THAT(EntrySource(f), HasSubstr("params["));
}

// Type promotion as ATen does it, and integer/bool semantics.
std::vector<at::Tensor> PromotionOps(const Args& a) {
  const at::Tensor &i = a[0].toTensor(), &j = a[1].toTensor(), &x = a[2].toTensor(),
                   &d = a[3].toTensor(), &b = a[4].toTensor(), &d0 = a[5].toTensor(),
                   &i0 = a[6].toTensor();
  return {i + 2.5,          // i64 + float Scalar -> f32
          i * j,            // i64, wrapping
          i + j * 3,        // i64 Scalar literal
          torch::add(i, j, -2),
          i - 3,
          i + x,            // i64 + f32 -> f32
          x + d0,           // f32 + 0-dim f64 -> f32
          x * d,            // f32 * f64 -> f64
          i * d0,           // i64 * 0-dim f64 -> f64 (a higher category promotes)
          i + i0,           // i64 + 0-dim i64
          torch::relu(i), torch::abs(i), -i, torch::square(i),
          i / j,            // true division -> f32
          torch::maximum(i, j), torch::minimum(i, j), i.clamp_min(0), i.clamp_max(2),
          torch::exp(i.clamp_max(5)),  // int -> float op
          b * x,            // bool * f32 -> f32
          b + i,            // bool + i64 -> i64
          x < d, i >= 2.5, i == j, x != x, x.eq(d0), d.le(i0), i.gt(x), x.ge(0),
          x.eq(-1.5), i >= j, x.le(0.5), i.ne(2), b.ne(true),
          torch::where(x > 0, x, d),      // -> f64
          torch::where(b, i, x),          // i64/f32 -> f32
          torch::where(b, i, j),          // i64
          torch::where(i < 0, b, b.logical_not()),
          (x > 0) == b};
}

Args PromotionArgs() {
  const at::Tensor i = torch::tensor(std::vector<int64_t>{-5, -1, 0, 1, 2, 7, INT64_MAX, INT64_MIN});
  const at::Tensor j = torch::tensor(std::vector<int64_t>{3, -2, 5, 1, 2, -7, 1, -1});
  const at::Tensor x = torch::tensor(std::vector<double>{0.5, -1.5, NAN, INFINITY, -0.0, 2.0, 1e-3, -7.0}, torch::kFloat);
  const at::Tensor d = torch::tensor(std::vector<double>{1.25, 3.0, -2.0, 0.0, 1e300, -1e-300, NAN, 4.0}, torch::kDouble);
  const at::Tensor b = torch::tensor({true, false, true, true, false, false, true, false});
  const at::Tensor d0 = torch::tensor(0.1, torch::kDouble);  // 0-dim double: does not promote f32
  const at::Tensor i0 = torch::tensor(int64_t{3});
  return {i, j, x, d, b, d0, i0};
}

TEST(CppBackend, TypePromotionAndDtypes) {
  ScopedCacheDir dir;
  ExpectFusedMatchesEager(PromotionOps, PromotionArgs(), 1);
}

// The transcendental and rounding ops on special values, for f32 and f64.
std::vector<at::Tensor> FloatOps(const Args& a) {
  const at::Tensor& x = a[0].toTensor();
  std::vector<at::Tensor> out = {torch::gelu(x), torch::gelu(x, "tanh"), torch::silu(x), torch::erf(x),
                                 torch::erfc(x), torch::log1p(x), torch::expm1(x), torch::log2(x),
                                 torch::log10(x), torch::sin(x), torch::cos(x), torch::floor(x),
                                 torch::ceil(x), torch::trunc(x), torch::round(x)};
  for (double e : {0.0, 1.0, 2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 2.5, -1.75}) out.push_back(torch::pow(x, e));
  out.push_back(torch::pow(x, 2));
  return out;
}

TEST_P(CppBackendTest, FloatOpsMatchEagerOnSpecialValues) {
  ScopedCacheDir dir;
  std::vector<double> xs = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5,
                            1e-7, -1e-7, 20.0, -20.0, 88.0, -88.0, 1e10, -1e10, 0.9999, -0.9999};
  for (int k = 0; k < 100; ++k) xs.push_back(std::sin(k) * 6);
  const Args args = {torch::tensor(xs, torch::TensorOptions().dtype(GetParam()))};
  const std::string source = ExpectFusedMatchesEager(FloatOps, args, 1);
  for (const char* op : {"aten::gelu", "aten::silu", "aten::erf", "aten::pow.Tensor_Scalar", "aten::round"}) {
    EXPECT_THAT(source, HasSubstr(op));
  }
}

// Row reductions over the last dim, with and without a fused prologue, keepdim, NaN/Inf rows,
// broadcast and strided operands (Note [Row reductions]).
std::vector<at::Tensor> Reductions(const Args& a) {
  const at::Tensor& x = a[0].toTensor();    // [R, C]
  const at::Tensor& col = a[1].toTensor();  // [C]
  const at::Tensor& xt = a[2].toTensor();   // [R, C], transposed storage
  const at::Tensor h = torch::tanh(x * col + 1);
  return {torch::softmax(h, -1),
          torch::log_softmax(x * 0.5, 1) * 2,  // an epilogue: not a lone softmax (Note [Lone softmax])
          h.sum(-1), torch::sum(x - col, {1}, /*keepdim=*/true),
          h.mean(-1), torch::mean(x, {-1}, true),
          torch::amax(h, -1), torch::amax(x, {1}, true),
          torch::softmax(xt - 1, -1), torch::sum(xt, -1),  // softmax fused (Note [Lone softmax])
          torch::layer_norm(x * col - 1, {x.size(1)}, a[3].toTensor(), a[4].toTensor()),
          torch::layer_norm(h, {x.size(1)}),
          torch::layer_norm(xt, {x.size(1)}, a[3].toTensor(), {}, 1e-3)};
}

TEST_P(CppBackendTest, RowReductionsMatchEager) {
  ScopedCacheDir dir;
  const auto opts = torch::TensorOptions().dtype(GetParam());
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 5}, {64, 1000}, {200, 300}}) {
    at::Tensor x = torch::randn({rows, cols}, opts) * 3;
    if (rows >= 3 && cols >= 5) {  // a NaN row, an Inf row, an all -Inf row
      x[0][1] = NAN;
      x[1][2] = INFINITY;
      x[2].fill_(-INFINITY);
    }
    const Args args = {x, torch::randn({cols}, opts), torch::randn({cols, rows}, opts).t(),
                       torch::randn({cols}, opts), torch::randn({cols}, opts)};
    ExpectKernelsRan kernels_ran;
    CompiledFunction f = compile(Reductions, Cpp());
    const auto got = CallCached(f, args), want = Reductions(args);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      // Sums in another order: rounding errors grow with the row length. A row of one element
      // makes layer_norm cancel (x * rstd - rstd * mean with rstd = 1/sqrt(eps) ~ 316, as ATen's
      // kernel computes it too): both sides err by up to |x| * 316 * 2^-24 * |w| ~ 3e-4 in float
      // for |x| ~ 10, |w| ~ 2, with their own rounding of the mean.
      const double floor = GetParam() == at::kFloat ? (cols == 1 ? 2e-3 : 1e-4) : 1e-10;
      const double atol = std::max(Atol(GetParam()) * 10 * cols, floor);
      ExpectMatches(got[i], want[i], Rtol(GetParam()), atol, absl::StrCat("output ", i));
    }
    EXPECT_GE(FusedRegions(f), 9) << "fusion silently stopped";
    const std::string source = EntrySource(f);
    for (const char* op : {"aten::softmax.int", "aten::log_softmax.int", "aten::sum.dim_IntList",
                           "aten::mean.dim", "aten::amax", "aten::layer_norm"}) {
      EXPECT_THAT(source, HasSubstr(op)) << op;
    }
  }
}

// The tolerance of a reduction over `n` elements: sums in another order than ATen's.
double ReductionAtol(at::ScalarType t, int64_t n) {
  return std::max(Atol(t) * 10 * static_cast<double>(n), t == at::kFloat ? 1e-4 : 1e-10);
}

void ExpectReductionsMatch(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                           at::ScalarType t, int64_t n) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ExpectMatches(got[i], want[i], Rtol(t), ReductionAtol(t, n), absl::StrCat("output ", i));
  }
}

// Reductions over every dim of a 3-d tensor (negative dims, keepdim), with prologues, broadcast
// operands, transposed and sliced inputs (Note [Row reductions], the column kernel).
std::vector<at::Tensor> AnyDimReductions(const Args& a) {
  const at::Tensor& x = a[0].toTensor();   // [A, B, C]
  const at::Tensor& c = a[1].toTensor();   // [C]
  const at::Tensor& xt = a[2].toTensor();  // [A, B, C], permuted storage
  const at::Tensor& xs = a[3].toTensor();  // [A, B, C], sliced
  const at::Tensor h = torch::tanh(x * c + 1);
  return {torch::softmax(h, 0), torch::softmax(x, 1), torch::softmax(x * 0.5, -2),
          torch::log_softmax(h, 0), torch::log_softmax(x, -3),
          torch::sum(x, {0}), torch::sum(h, {1}, /*keepdim=*/true), torch::sum(x - c, {-2}),
          torch::mean(x, {0}, true), torch::mean(h, {-2}),
          torch::amax(x, {0}), torch::amax(h, {1}, true), torch::amax(x, {-2}),
          torch::softmax(xt, 0), torch::sum(xt, {1}), torch::amax(xt, {0}, true),
          torch::log_softmax(xs, 1), torch::mean(xs, {0})};
}

TEST_P(CppBackendTest, ReductionsOverAnyDimMatchEager) {
  ScopedCacheDir dir;
  const auto opts = torch::TensorOptions().dtype(GetParam());
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {1, 1, 1}, {3, 4, 5}, {2, 1, 7}, {5, 3, 1}, {7, 130, 9}, {40, 3, 300}}) {
    at::Tensor x = torch::randn(shape, opts) * 3;
    if (shape[0] >= 3 && shape[2] >= 5) {  // a NaN column, an Inf column, an all -Inf column
      x[1][0][1] = NAN;
      x[0][1][2] = INFINITY;
      x.select(2, 3).select(1, 0).fill_(-INFINITY);
    }
    const at::Tensor xt = torch::randn({shape[2], shape[1], shape[0]}, opts).permute({2, 1, 0});
    const at::Tensor xs = torch::randn({shape[0], shape[1] + 3, shape[2] * 2}, opts).slice(1, 2, 2 + shape[1]).slice(2, 0, shape[2] * 2, 2);
    const Args args = {x, torch::randn({shape[2]}, opts), xt, xs};
    ExpectKernelsRan kernels_ran;
    CompiledFunction f = compile(AnyDimReductions, Cpp());
    ExpectReductionsMatch(CallCached(f, args), AnyDimReductions(args), GetParam(),
                          *std::max_element(shape.begin(), shape.end()));
    EXPECT_GE(FusedRegions(f), 15) << "fusion silently stopped";
    const std::string source = EntrySource(f);
    for (const char* op : {"aten::softmax.int", "aten::log_softmax.int", "aten::sum.dim_IntList",
                           "aten::mean.dim", "aten::amax"}) {
      EXPECT_THAT(source, HasSubstr(op)) << op;
    }
    EXPECT_THAT(source, HasSubstr("const int64_t cols"));  // the column kernel
  }
}

// The region comment of the kernel running `op` (its first line lists the region's nodes).
std::string RegionOf(const std::string& source, const std::string& op) {
  std::istringstream in(source);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("// Nodes %", 0) == 0 && line.find(op) != std::string::npos) return line;
  }
  return "";
}

// sum/mean/amax over several consecutive dims (merged into one reduced dim) and over every dim,
// with epilogues; dims that are not consecutive, or do not merge for a permuted input, are
// replayed and still match eager.
std::vector<at::Tensor> MultiDimReductions(const Args& a) {
  const at::Tensor& x = a[0].toTensor();   // [A, B, C]
  const at::Tensor& xt = a[1].toTensor();  // [A, B, C], permuted storage
  const at::Tensor& rows = a[2].toTensor();  // [A]
  return {torch::sum(x, at::IntArrayRef{0, 1}), torch::mean(x * 2, {-2, -1}, /*keepdim=*/true), torch::amax(x, {2, 1}),
          torch::mean(x, {1, 2}) * rows, torch::sum(x) * 0.5, torch::mean(torch::exp(x)),
          torch::amax(x, {}, true), torch::sum(x, at::IntArrayRef{0, 2}), torch::sum(xt, at::IntArrayRef{0, 1})};
}

TEST_P(CppBackendTest, MultiDimReductionsMatchEager) {
  ScopedCacheDir dir;
  const auto opts = torch::TensorOptions().dtype(GetParam());
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{1, 1, 1}, {3, 4, 5}, {6, 70, 90}}) {
    at::Tensor x = torch::randn(shape, opts);
    if (shape[0] >= 3) x[1][2][3] = NAN;
    const Args args = {x, torch::randn({shape[2], shape[1], shape[0]}, opts).permute({2, 1, 0}),
                       torch::randn({shape[0]}, opts)};
    ExpectKernelsRan kernels_ran;
    CompiledFunction f = compile(MultiDimReductions, Cpp());
    ExpectReductionsMatch(CallCached(f, args), MultiDimReductions(args), GetParam(),
                          shape[0] * shape[1] * shape[2]);
    const std::string source = EntrySource(f);
    EXPECT_GE(FusedRegions(f), 7) << source;
    EXPECT_THAT(source, HasSubstr(": aten::mean.dim, aten::mul.Tensor\n"));  // * rows: unsqueezed twice
    EXPECT_THAT(source, HasSubstr(": aten::sum, aten::mul.Scalar"));
    EXPECT_THAT(source, HasSubstr(": aten::exp, aten::mean"));
  }
}

// Elementwise nodes after a reduction run in its kernel (Note [Row reductions]): one region per
// function, listing the reduction and its epilogue; full-shaped (softmax, layer_norm) and
// reduced-shaped (sum, mean, amax, with and without keepdim) epilogues, over the last and a
// leading dim, with broadcast operands, a bool result, and the reduction's own result returned
// too or only used by the epilogue (the kernel's scratch row).
TEST_P(CppBackendTest, EpiloguesFuseIntoTheReduction) {
  ScopedCacheDir dir;
  const auto opts = torch::TensorOptions().dtype(GetParam());
  struct Case {
    const char* name;
    Fn fn;
    std::vector<const char*> ops;  // in the reduction's region, in order
  };
  const std::vector<Case> cases = {
      {"softmax_mul_add", [](const Args& a) -> std::vector<at::Tensor> {
         return {torch::softmax(a[0].toTensor(), -1) * a[1].toTensor() + 1}; },
       {"aten::softmax.int", "aten::mul.Tensor", "aten::add.Scalar"}},
      {"softmax_dim0_mul_also_returned", [](const Args& a) -> std::vector<at::Tensor> {
         const at::Tensor s = torch::softmax(a[0].toTensor() * 2, 0);
         return {s * a[1].toTensor(), s}; },
       {"aten::mul.Scalar", "aten::softmax.int", "aten::mul.Tensor"}},
      {"log_softmax_dim0_exp", [](const Args& a) -> std::vector<at::Tensor> {
         return {torch::exp(torch::log_softmax(a[0].toTensor(), 0)) - a[1].toTensor()}; },
       {"aten::log_softmax.int", "aten::exp", "aten::sub.Tensor"}},
      {"layer_norm_gelu", [](const Args& a) -> std::vector<at::Tensor> {
         const at::Tensor& x = a[0].toTensor();
         return {torch::gelu(torch::layer_norm(x + 1, {x.size(1)}, a[3].toTensor(), a[3].toTensor()))}; },
       {"aten::add.Scalar", "aten::layer_norm", "aten::gelu"}},
      {"sum_keepdim_div_tanh", [](const Args& a) -> std::vector<at::Tensor> {
         const at::Tensor& x = a[0].toTensor();
         return {torch::tanh(torch::sum(x, {-1}, true) / static_cast<double>(x.size(1)))}; },
       {"aten::sum.dim_IntList", "aten::div.Scalar", "aten::tanh"}},
      {"mean_dim1_mul_rows", [](const Args& a) -> std::vector<at::Tensor> {
         return {torch::mean(a[0].toTensor(), {1}) * a[2].toTensor() - 0.5}; },
       {"aten::mean.dim", "aten::mul.Tensor", "aten::sub.Scalar"}},
      {"sum_dim0_mul_cols", [](const Args& a) -> std::vector<at::Tensor> {
         const at::Tensor s = torch::sum(torch::relu(a[0].toTensor()), {0});
         return {torch::sigmoid(s * a[3].toTensor()), s}; },
       {"aten::relu", "aten::sum.dim_IntList", "aten::mul.Tensor", "aten::sigmoid"}},
      {"sum_dim0_same_operand_before_and_after", [](const Args& a) -> std::vector<at::Tensor> {
         const at::Tensor& c = a[3].toTensor();
         return {torch::sum(a[0].toTensor() * c, {0}) + c}; },
       {"aten::mul.Tensor", "aten::sum.dim_IntList", "aten::add.Tensor"}},
      {"amax_dim0_keepdim_gt", [](const Args& a) -> std::vector<at::Tensor> {
         return {torch::amax(a[0].toTensor(), {0}, true) - a[3].toTensor() > 0}; },
       {"aten::amax", "aten::sub.Tensor", "aten::gt.Scalar"}},
  };
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 5}, {64, 300}, {300, 64}}) {
    at::Tensor x = torch::randn({rows, cols}, opts) * 3;
    if (rows >= 3 && cols >= 5) {
      x[0][1] = NAN;
      x[1][2] = INFINITY;
      x[2].fill_(-INFINITY);
    }
    // y: [R, C] (transposed storage), rows: [R], cols: [C].
    const Args args = {x, torch::randn({cols, rows}, opts).t(), torch::randn({rows}, opts), torch::randn({cols}, opts)};
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(c.name, " on ", rows, "x", cols));
      ExpectKernelsRan kernels_ran;
      CompiledFunction f = compile(c.fn, Cpp(c.name));
      ExpectReductionsMatch(CallCached(f, args), c.fn(args), GetParam(), std::max(rows, cols));
      EXPECT_EQ(FusedRegions(f), 1);
      const std::string region = RegionOf(EntrySource(f), c.ops.front());
      std::string want;
      for (const char* op : c.ops) want += std::string(want.empty() ? ": " : ", ") + op;
      EXPECT_THAT(region, ::testing::EndsWith(want)) << EntrySource(f);
    }
  }
}

// A reduction kernel computes any range [begin, end) of its lines (the artifact splits them over
// ATen's threads, also in the middle of a row of a block of columns; Note [Row reductions]):
// every split gives what one call over all lines does.
TEST(CppBackend, ReductionKernelsRunAnySplitOfTheirLines) {
  ScopedCacheDir dir;
  const std::vector<tracer::TracedFn> fns = {
      [](const Args& a) -> std::vector<at::Tensor> { return {torch::softmax(a[0].toTensor() * 2, 0) + 1}; },
      [](const Args& a) -> std::vector<at::Tensor> { return {torch::sum(a[0].toTensor(), {1}) * 3}; },
      [](const Args& a) -> std::vector<at::Tensor> { return {torch::log_softmax(a[0].toTensor() - 1, -1)}; },
      [](const Args& a) -> std::vector<at::Tensor> { return {torch::amax(a[0].toTensor(), {0}, true)}; },
  };
  const at::Tensor x = torch::randn({40, 7, 33});
  for (size_t i = 0; i < fns.size(); ++i) {
    SCOPED_TRACE(i);
    const tracer::TraceResult t = tracer::Trace(fns[i], {x}, {"x"});
    const codegen::PointwisePlan plan = codegen::PlanPointwise(*t.graph);
    ASSERT_EQ(plan.regions.size(), 1u);
    const codegen::PointwiseRegion& r = plan.regions[0];
    ASSERT_NE(r.reduction, codegen::ReductionKind::kNone);
    ASSERT_EQ(r.inputs.size(), 1u);
    ASSERT_EQ(r.outputs.size(), 1u);
    const auto library = codegen::LoadKernels(plan.source, {r.function});
    ASSERT_TRUE(library.ok()) << library.status();
    const auto kernel = reinterpret_cast<codegen::PointwiseKernelFn>((*library)->Find(r.function));
    int64_t reduced = 1;
    for (int d = r.reduced_dim; d < r.reduced_dim + r.reduced_count; ++d) reduced *= x.size(d);
    const int64_t lines = x.numel() / reduced;
    const void* in[] = {x.data_ptr()};
    auto run = [&](int64_t step) {
      at::Tensor y = torch::full(t.outputs[0].sizes(), NAN);
      void* out[] = {y.data_ptr()};
      for (int64_t begin = 0; begin < lines; begin += step) kernel(in, out, nullptr, begin, std::min(lines, begin + step));
      return y;
    };
    const at::Tensor whole = run(lines);
    ExpectMatches(whole, t.outputs[0], 1e-5, 1e-5);
    for (int64_t step : {1, 5, 32, 64, 65, 100}) {
      ExpectMatches(run(step), whole, 1e-6, 1e-7, absl::StrCat("step ", step));
      // One range alone writes the elements of its lines and nothing else.
      at::Tensor y = torch::full(t.outputs[0].sizes(), NAN);
      void* out[] = {y.data_ptr()};
      const int64_t begin = 3, end = std::min(lines, begin + step);
      kernel(in, out, nullptr, begin, end);
      const at::Tensor written = torch::isfinite(y);
      EXPECT_EQ(written.sum().item<int64_t>(), (end - begin) * (y.numel() / lines)) << "step " << step;
      ExpectMatches(y.masked_select(written), whole.masked_select(written), 1e-6, 1e-7);
    }
  }
}

// Empty tensors: an empty outer or inner dim runs no line; an empty reduced dim is not fused
// (sum gives zeros, mean NaN, as eager).
TEST(CppBackend, EmptyReductions) {
  ScopedCacheDir dir;
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    return {torch::softmax(x * 2, 1) + 1, torch::sum(x, {1}) * 2, torch::amax(x, {-1}, true),
            torch::softmax(x, 0), torch::mean(x, {0})};
  };
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{0, 5}, {4, 0, 3}, {0, 3, 2}}) {
    SCOPED_TRACE(tracer::ShapeString(shape));
    const Args args = {torch::randn(shape)};
    ExpectKernelsRan kernels_ran;
    CompiledFunction f = compile(fn, Cpp());
    ExpectAllMatch(CallCached(f, args), fn(args));
  }
}

// Symbolic sizes: sizes and outer strides of reduction kernels are params (Note [Row
// reductions]); one kernel serves every size, with epilogues, over the last and a leading dim.
TEST(CppBackend, ReductionsWithSymbolicSizesShareOneKernel) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  Options o = Cpp();
  o.dynamic = Dynamic::kDynamic;
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();
    const at::Tensor& y = a[1].toTensor();
    return {torch::softmax(x * 2, -1) * y, torch::sum(x, {0}), torch::log_softmax(x, 0) + 1,
            torch::mean(x, {1}, true) - y, torch::amax(y, {0}), torch::sum(x * y, at::IntArrayRef{0, 1})};
  };
  CompiledFunction f = compile(fn, o);
  for (const auto& [n, m] : std::vector<std::pair<int64_t, int64_t>>{{3, 17}, {9, 17}, {70, 2}, {500, 300}, {3, 17}}) {
    const Args args = {torch::randn({n, m}), torch::randn({n, m})};
    f(args);
    const auto got = f(args), want = fn(args);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ExpectMatches(got[i], want[i], 1e-5, ReductionAtol(at::kFloat, std::max(n, m)));
  }
  EXPECT_EQ(f.stats().compiles, 1);
  const std::string source = EntrySource(f);
  EXPECT_THAT(source, HasSubstr("(symbolic): aten::mul.Scalar, aten::softmax.int, aten::mul.Tensor"));
  EXPECT_THAT(source, HasSubstr("aten::sum.dim_IntList"));
  EXPECT_THAT(source, HasSubstr("aten::amax"));
  EXPECT_THAT(source, HasSubstr("params["));
  // layer_norm's normalized shape is part of the graph: its rows vary, its width must not.
  auto ln = [](const Args& a) -> std::vector<at::Tensor> {
    return {torch::gelu(torch::layer_norm(a[0].toTensor() * 2, {8}))};
  };
  CompiledFunction g = compile(ln, o);
  for (int64_t n : {3, 50, 3}) {
    const Args args = {torch::randn({n, 8})};
    g(args);
    ExpectAllMatch(g(args), ln(args));
  }
  EXPECT_THAT(EntrySource(g), HasSubstr("aten::layer_norm, aten::gelu"));
}

// Note [Inlined constants]: small captured tensors are literals in the kernel; an in-place update
// of one between calls (and anything else that may change its values) makes the region replay,
// which matches eager; a large constant, a view and an inference tensor stay pointers.
TEST(CppBackend, SmallConstantsAreInlinedAndChecked) {
  ScopedCacheDir dir;
  const at::Tensor scale = torch::tensor({0.5f, -2.0f, 3.0f, 1.0f});  // [4], a closure constant
  const at::Tensor shift = torch::tensor(1.25f);                       // 0-dim
  const at::Tensor big = torch::randn({8, 4});                         // 32 elements: a pointer
  auto fn = [=](const Args& a) -> std::vector<at::Tensor> {
    const at::Tensor& x = a[0].toTensor();  // [8, 4]
    return {torch::softmax(x * scale + shift, -1) * scale, torch::tanh(x - big)};
  };
  const Args args = {torch::randn({8, 4})};
  CompiledFunction f = compile(fn, Cpp());
  {
    ExpectKernelsRan kernels_ran;
    ExpectAllMatch(CallCached(f, args), fn(args));
  }
  const std::string source = EntrySource(f);
  EXPECT_THAT(source, HasSubstr("static const float in1[] = {(0x1p-1f), (-0x1p+1f), (0x1.8p+1f), (0x1p+0f)};"));
  EXPECT_THAT(source, ::testing::ContainsRegex("static const float in[0-9]+\\[\\] = \\{\\(0x1.4p\\+0f\\)\\};"));
  EXPECT_THAT(source, ::testing::ContainsRegex("\\(in\\[[0-9]+\\]\\);  // %c"));  // big
  // In-place updates between calls: each call after one replays the region and matches eager.
  int64_t fallbacks = CodegenRegionFallbacks();
  for (int i = 0; i < 3; ++i) {
    scale.mul_(-1.5);
    shift.add_(1);
    ExpectAllMatch(f(args), fn(args));
    EXPECT_GT(CodegenRegionFallbacks(), fallbacks) << "the changed constant's kernel ran";
    fallbacks = CodegenRegionFallbacks();
  }
  {
    c10::InferenceMode inference;  // an in-place update of a normal tensor still bumps its version
    scale[0] = 7.0f;
  }
  ExpectAllMatch(f(args), fn(args));
  EXPECT_GT(CodegenRegionFallbacks(), fallbacks);
  EXPECT_EQ(f.stats().compiles, 1);
  // A constant that shares its storage (a view of it exists) is not inlined; its kernel runs.
  const at::Tensor viewed = torch::tensor({1.0f, 2.0f});
  const at::Tensor view = viewed.view({2, 1});
  auto g = [viewed](const Args& a) -> std::vector<at::Tensor> { return {a[0].toTensor() * viewed + 1}; };
  CompiledFunction fg = compile(g, Cpp("viewed"));
  const Args gargs = {torch::randn({3, 2})};
  {
    ExpectKernelsRan kernels_ran;
    ExpectAllMatch(CallCached(fg, gargs), g(gargs));
    view.mul_(3);  // through the view: the constant changed
    ExpectAllMatch(fg(gargs), g(gargs));
  }
  EXPECT_THAT(EntrySource(fg), Not(HasSubstr("(inlined)")));
}

// Writes no version counter sees: a captured tensor over host memory (from_blob) that the host
// application rewrites between calls, as a game or robotics loop does with calibration values,
// and a memcpy into an ATen tensor's data_ptr(). The inlined literals are checked against the
// constant's current bytes, so every call after a write replays the region and matches eager.
TEST(CppBackend, RawWritesToInlinedConstantsAreSeen) {
  ScopedCacheDir dir;
  float host[4] = {0.5f, -2.0f, 3.0f, 1.0f};
  // Lent with a (no-op) deleter: the caller keeps `host` alive. Without one, Warden would not
  // capture it (Note [Captured tensors]: from_blob memory nobody owns runs eagerly).
  const at::Tensor calib = torch::from_blob(host, {4}, [](void*) {});
  const at::Tensor bias = torch::tensor({0.25f, 1.0f, -1.0f, 2.0f});
  auto fn = [calib, bias](const Args& a) -> std::vector<at::Tensor> {
    return {torch::tanh(a[0].toTensor() * calib + bias)};
  };
  const Args args = {torch::randn({8, 4})};
  CompiledFunction f = compile(fn, Cpp("raw_writes"));
  {
    ExpectKernelsRan kernels_ran;
    ExpectAllMatch(CallCached(f, args), fn(args));
  }
  EXPECT_THAT(EntrySource(f), HasSubstr("(inlined)"));
  int64_t fallbacks = CodegenRegionFallbacks();
  for (int i = 0; i < 3; ++i) {
    for (float& v : host) v = v * -1.5f + 0.25f;  // no ATen op, no version bump
    ExpectAllMatch(f(args), fn(args));
    EXPECT_GT(CodegenRegionFallbacks(), fallbacks) << "the kernel ran on stale host values";
    fallbacks = CodegenRegionFallbacks();
  }
  const float fresh[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  std::memcpy(bias.data_ptr<float>(), fresh, sizeof(fresh));
  ExpectAllMatch(f(args), fn(args));
  EXPECT_GT(CodegenRegionFallbacks(), fallbacks) << "the kernel ran on a stale bias";
  EXPECT_EQ(f.stats().compiles, 1);
}

// A graph with nothing to fuse needs no compiler.
TEST(CppBackend, NothingFusibleCompilesNothing) {
  ScopedCacheDir dir;
  ScopedEnv path("PATH", "/nonexistent");
  auto fn = [](const Args& a) -> std::vector<at::Tensor> {
    return {torch::cumsum(torch::matmul(a[0].toTensor(), a[0].toTensor().t()), -1)};
  };
  const at::Tensor x = torch::randn({4, 6});
  CompiledFunction f = compile(fn, Cpp());
  ExpectAllMatch(CallCached(f, {x}), fn({x}));
  EXPECT_EQ(EntryBackend(f), kBackend);
  EXPECT_TRUE(dir.Files(".so").empty());
}

double MillisOfFirstCall(CompiledFunction& f, const Args& args) {
  const auto t0 = std::chrono::steady_clock::now();
  f(args);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

TEST(CppBackend, SecondCompileHitsTheDiskCache) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  const at::Tensor x = torch::randn({16}), w = torch::randn({16});
  const codegen::KernelCacheStats s0 = codegen::GetKernelCacheStats();
  double cold, warm;
  {
    CompiledFunction f = compile(Chain10Fn, Cpp("cold"));
    cold = MillisOfFirstCall(f, {x, w});
    ExpectAllMatch(f({x, w}), {Chain10(x, w)});
  }
  const codegen::KernelCacheStats s1 = codegen::GetKernelCacheStats();
  EXPECT_EQ(s1.compiles, s0.compiles + 1);
  ASSERT_EQ(dir.Files(".so").size(), 1u);
  ASSERT_EQ(dir.Files(".cc").size(), 1u);
  // The library is named by its key and records it; the source next to it is the kernel's.
  const std::string so = dir.Files(".so")[0];
  const std::string key = fs::path(so).stem().string();
  EXPECT_EQ(key.size(), 32u);
  EXPECT_THAT(ReadFile(so), HasSubstr("warden-kernel-key:" + key));

  CompiledFunction g = compile(Chain10Fn, Cpp("warm"));
  warm = MillisOfFirstCall(g, {x, w});
  ExpectAllMatch(g({x, w}), {Chain10(x, w)});
  const codegen::KernelCacheStats s2 = codegen::GetKernelCacheStats();
  EXPECT_EQ(s2.compiles, s1.compiles);
  EXPECT_EQ(s2.disk_hits, s1.disk_hits + 1);
  std::cout << "first call incl. trace + compile: cold " << cold << " ms, warm (disk cache) " << warm
            << " ms\n";
}

// The child half of SecondProcessLoadsWithoutCompiling (skipped unless spawned by it).
TEST(CppBackend, ChildProcessLoadsFromDisk) {
  if (std::getenv("WARDEN_TEST_CHILD") == nullptr) GTEST_SKIP() << "only run as a child process";
  const at::Tensor x = torch::randn({16}), w = torch::randn({16});
  const auto t0 = std::chrono::steady_clock::now();
  CompiledFunction f = compile(Chain10Fn, Cpp("child"));
  f({x, w});
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ExpectAllMatch(f({x, w}), {Chain10(x, w)});
  EXPECT_EQ(EntryBackend(f), kBackend);
  const codegen::KernelCacheStats s = codegen::GetKernelCacheStats();
  EXPECT_EQ(s.compiles, 0);
  EXPECT_EQ(s.disk_hits, 1);
  std::cout << "child process: first call incl. trace + disk-cache load " << ms << " ms\n";
}

TEST(CppBackend, SecondProcessLoadsWithoutCompiling) {
  if (std::getenv("WARDEN_TEST_CHILD") != nullptr) GTEST_SKIP();
  ScopedCacheDir dir;
  {
    CompiledFunction f = compile(Chain10Fn, Cpp("parent"));
    const at::Tensor x = torch::randn({16}), w = torch::randn({16});
    f({x, w});
  }
  ASSERT_EQ(dir.Files(".so").size(), 1u);
  ScopedEnv child("WARDEN_TEST_CHILD", "1");
  // The child must not touch the parent's Bazel/gtest result files.
  ScopedEnv no_exit_file("TEST_PREMATURE_EXIT_FILE", nullptr);
  ScopedEnv no_xml("XML_OUTPUT_FILE", nullptr);
  ScopedEnv no_gtest_output("GTEST_OUTPUT", nullptr);
  ScopedEnv no_shard_file("TEST_SHARD_STATUS_FILE", nullptr);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=CppBackend.ChildProcessLoadsFromDisk";
  std::vector<char*> argv = {self.data(), filter.data(), nullptr};
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child process failed (its output is above)";
}

TEST(CppBackend, CorruptCachedLibraryIsRebuilt) {
  ScopedCacheDir dir;
  ExpectKernelsRan kernels_ran;
  const at::Tensor x = torch::randn({100}), w = torch::randn({100});
  {
    CompiledFunction f = compile(Chain10Fn, Cpp());
    f({x, w});
  }  // unloaded here
  ASSERT_EQ(dir.Files(".so").size(), 1u);
  const std::string so = dir.Files(".so")[0];
  const std::string good = ReadFile(so);
  const std::vector<std::string> corruptions = {"garbage, not an ELF file",
                                                good.substr(0, good.size() / 2)};  // truncated
  for (const std::string& bad : corruptions) {
    fs::remove(so);  // a new file (inode): never the one a live library maps
    std::ofstream(so, std::ios::binary) << bad;
    const codegen::KernelCacheStats s0 = codegen::GetKernelCacheStats();
    {
      CompiledFunction f = compile(Chain10Fn, Cpp());
      ExpectAllMatch(CallCached(f, {x, w}), {Chain10(x, w)});
      EXPECT_EQ(EntryBackend(f), kBackend);
    }
    const codegen::KernelCacheStats s1 = codegen::GetKernelCacheStats();
    EXPECT_EQ(s1.discarded, s0.discarded + 1);
    EXPECT_EQ(s1.compiles, s0.compiles + 1);
    EXPECT_EQ(ReadFile(so).size(), good.size());
  }
}

TEST(CppBackend, NoCompilerFallsBackToAten) {
  ScopedCacheDir dir;
  ScopedEnv cxx("WARDEN_CXX", nullptr);
  ScopedEnv path("PATH", "/nonexistent");
  const at::Tensor x = torch::randn({16}), w = torch::randn({16});
  CompiledFunction f = compile(Chain10Fn, Cpp());
  ExpectAllMatch(CallCached(f, {x, w}), {Chain10(x, w)});
  ExpectAllMatch(f({x, w}), {Chain10(x, w)});
  EXPECT_EQ(f.stats().compiles, 1);
  EXPECT_EQ(f.stats().cache_hits, 2);
  EXPECT_EQ(EntryBackend(f), "aten");
  EXPECT_THAT(f.explain(), HasSubstr("backend 'cpp' failed (no C++ compiler: 'g++' is not in PATH=/nonexistent"));
  EXPECT_TRUE(dir.Files(".so").empty());
}

TEST(CppBackend, CompileErrorFallsBackWithTheCompilersMessage) {
  ScopedCacheDir dir;
  // A "compiler" that always fails with a message.
  const std::string fake = dir.root() + "/fake-cxx";
  std::ofstream(fake) << "#!/bin/sh\n"
                          "if [ \"$1\" = --version ]; then echo 'fake-cxx 1.0'; exit 0; fi\n"
                          "echo 'fake-cxx: internal compiler error: out of luck' >&2\n"
                          "exit 3\n";
  fs::permissions(fake, fs::perms::owner_all);
  ScopedEnv cxx("WARDEN_CXX", fake.c_str());
  const at::Tensor x = torch::randn({16}), w = torch::randn({16});
  CompiledFunction f = compile(Chain10Fn, Cpp());
  ExpectAllMatch(CallCached(f, {x, w}), {Chain10(x, w)});
  EXPECT_EQ(EntryBackend(f), "aten");
  const std::string text = f.explain();
  EXPECT_THAT(text, HasSubstr("failed (exit 3)"));
  EXPECT_THAT(text, HasSubstr("internal compiler error: out of luck"));
}

// LoadKernels' error channel, code and message, without going through compile().
TEST(KernelCache, ErrorsCarryCodeAndMessage) {
  ScopedCacheDir dir;
  {
    ScopedEnv path("PATH", "/nonexistent");
    ScopedEnv cxx("WARDEN_CXX", nullptr);
    auto lib = codegen::LoadKernels("extern \"C\" void k(const void**, void**, long) {}", {"k"});
    EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(lib.status().message(), HasSubstr("no C++ compiler"));
  }
  auto bad = codegen::LoadKernels("this is not C++;\n", {"k"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(bad.status().message(), HasSubstr("g++ failed (exit 1)"));
  EXPECT_THAT(bad.status().message(), HasSubstr("error:"));
  auto missing = codegen::LoadKernels("extern \"C\" void k(const void**, void**, long) {}\n", {"other"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing symbol other"));
  auto good = codegen::LoadKernels("extern \"C\" void k(const void**, void**, long) {}\n", {"k"});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_NE((*good)->Find("k"), nullptr);
  EXPECT_EQ((*good)->Find("other"), nullptr);
  EXPECT_EQ(fs::path((*good)->path()).parent_path().string(), dir.kernels());
}

// Concurrent builds of one key (threads here, processes in real use) all end with a loadable
// library: temp files are unique and renames atomic.
TEST(KernelCache, ConcurrentBuildsOfOneKey) {
  ScopedCacheDir dir;
  const std::string source = "extern \"C\" void k(const void**, void**, long) {}\n// concurrent\n";
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] { ok += codegen::LoadKernels(source, {"k"}).ok(); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_EQ(dir.Files(".so").size(), 1u);
  for (const auto& e : fs::directory_iterator(dir.kernels())) {
    EXPECT_THAT(e.path().string(), Not(HasSubstr(".tmp."))) << "a temp file was left behind";
  }
}

TEST(KernelCache, DirectoryDefaultsUnderHome) {
  ScopedEnv root("WARDEN_CACHE_DIR", nullptr);
  ScopedEnv home("HOME", "/home/someone");
  EXPECT_EQ(codegen::KernelCacheDir(), "/home/someone/.cache/warden/kernels");
  ScopedEnv set("WARDEN_CACHE_DIR", "/var/tmp/w");
  EXPECT_EQ(codegen::KernelCacheDir(), "/var/tmp/w/kernels");
}

}  // namespace
}  // namespace warden
